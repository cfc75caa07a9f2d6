"""fp8 attention of others that `python -m flashwatt.bench --dtypes fp8` times beside ours where
it is installed: peers of the benchmark, not backends of the pipeline (the registry's kernels
are; flashwatt.kernels.registry).

`CudnnFp8`: cuDNN's fp8 attention (its SDPA_FP8 graph node) through the cuDNN frontend's
Python package (`cudnn`, the wheel nvidia-cudnn-frontend; put it in .whl/ for a machine with
no network: tests/gpu/run_on_device.sh installs what is there). It takes bf16 inputs as ours
does and quantises them in the call, with one scale per tensor (cuDNN's fp8 node takes
scalar descales, not one per head): amax by torch, a scaled cast to e4m3, the graph (built
once per shape and mask), output in bf16. On Hopper cuDNN writes this node's output in e4m3
only (bf16 output needs Blackwell, it says when asked), so there the graph writes e4m3 with
scale_o = 448 / amax|V| (each output row is a convex combination of V's rows, so |O| <= amax|V|)
and the call converts it to bf16: that conversion, like the quantisation, is timed. PyTorch
2.11 exposes no fp8 attention of its own (scaled_dot_product_attention takes no float8
tensors), and TransformerEngine's fp8 attention needs its torch extension built against the
installed torch (it ships as source), so neither is a peer here.
"""
from __future__ import annotations

import math

E4M3_MAX = 448.0


class CudnnFp8:
    name = "cudnn_fp8"
    differentiable = False

    def __init__(self):
        self._graphs: dict = {}
        self._handle = None

    def supports(self, call, device) -> str | None:
        if getattr(device, "type", str(device)) != "cuda":
            return "cudnn_fp8 needs a CUDA device"
        import torch

        if torch.cuda.get_device_capability(device) < (9, 0):
            return "cudnn_fp8: cuDNN's fp8 attention needs compute capability 9.0 or newer"
        if call.pass_ != "fwd":
            return "cudnn_fp8 is timed as a forward only"
        return frontend_refusal()

    def __call__(self, q, k, v, call):
        import torch

        q8, dq = _per_tensor(q)
        k8, dk = _per_tensor(k)
        v8, dv = _per_tensor(v)
        fp8_out = torch.cuda.get_device_capability(q.device)[0] < 10
        out = torch.empty(q.shape, dtype=torch.float8_e4m3fn if fp8_out else torch.bfloat16, device=q.device)
        graph, tensors, workspace = self._graph(q8, k8, v8, out, bool(call.causal))
        one = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=q.device)
        # e4m3 output: O scaled by 448 / amax|V| (V's own scale), so the most |O| can be lands on
        # e4m3's largest value, and read back with V's descale
        descale_o = dv if fp8_out else one
        amax = torch.empty((2, 1, 1, 1, 1), dtype=torch.float32, device=q.device)
        values = {"q": q8, "k": k8, "v": v8, "descale_q": dq, "descale_k": dk, "descale_v": dv,
                  "descale_s": one / E4M3_MAX, "scale_s": one * E4M3_MAX, "scale_o": 1.0 / descale_o, "o": out,
                  "amax_s": amax[0], "amax_o": amax[1]}
        import cudnn

        cudnn.set_stream(handle=self._handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
        graph.execute({tensors[name]: value for name, value in values.items()}, workspace, handle=self._handle)
        return (out.float() * descale_o).to(q.dtype) if fp8_out else out

    def _graph(self, q8, k8, v8, out, causal: bool):
        """The SDPA_FP8 graph of these shapes and mask, built once: (graph, its tensors by name,
        its workspace)."""
        import cudnn
        import torch

        key = (tuple(q8.shape), tuple(k8.shape), causal, q8.device.index, out.dtype)
        if key in self._graphs:
            return self._graphs[key]
        if self._handle is None:
            self._handle = cudnn.create_handle()
        graph = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=self._handle)
        t = {name: graph.tensor_like(x, name=name) for name, x in (("q", q8), ("k", k8), ("v", v8))}
        for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
            t[name] = graph.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)
        o, _, amax_s, amax_o = graph.sdpa_fp8(
            q=t["q"], k=t["k"], v=t["v"], descale_q=t["descale_q"], descale_k=t["descale_k"],
            descale_v=t["descale_v"], descale_s=t["descale_s"], scale_s=t["scale_s"], scale_o=t["scale_o"],
            generate_stats=False, attn_scale=1.0 / math.sqrt(q8.shape[-1]), use_causal_mask=causal, name="sdpa_fp8")
        o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(
            cudnn.data_type.FP8_E4M3 if out.dtype == torch.float8_e4m3fn else cudnn.data_type.BFLOAT16)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
        t.update(o=o, amax_s=amax_s, amax_o=amax_o)
        graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        workspace = torch.empty(max(1, graph.get_workspace_size()), dtype=torch.uint8, device=q8.device)
        self._graphs[key] = (graph, t, workspace)
        return self._graphs[key]


def frontend_refusal() -> str | None:
    """Why `import cudnn` (the cuDNN frontend) fails here, in one line that starts with what
    failed: the missing module's name (the package itself, or one it imports) and where the
    package was found, if it was; None when it imports."""
    import importlib.util

    try:
        import cudnn  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any failure to load is the reason it is not a peer here
        missing = getattr(err, "name", None)
        try:
            spec = importlib.util.find_spec("cudnn")
        except Exception:  # noqa: BLE001 - a broken package: the error above says why
            spec = None
        where = f"package at {spec.origin}" if spec is not None and spec.origin else "no package 'cudnn' on sys.path"
        return (f"cudnn_fp8: import cudnn failed, {type(err).__name__}"
                + (f" (module {missing!r})" if missing else "") + f": {err}; {where} (the cuDNN frontend: pip wheel "
                "nvidia-cudnn-frontend, in .whl/ on a machine without network)")
    return None


def _per_tensor(x):
    """x in e4m3 with one scale for the whole tensor, and its descale as a (1, 1, 1, 1) tensor."""
    import torch

    amax = torch.linalg.vector_norm(x, ord=float("inf")).float().clamp_min(torch.finfo(torch.float32).tiny)
    scale = E4M3_MAX / amax
    x8 = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return x8, (1.0 / scale).reshape(1, 1, 1, 1)
