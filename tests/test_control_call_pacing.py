"""The pacing of attention calls in whole cycles (flashwatt.control.pacing, `target_cycle_s`,
opt-in): the idle a duty owes is paid once a cycle of it is owed, so the board idles for
tens of milliseconds at a time rather than 2 ms, and the controller reads the energy
counter over those cycles (their length is what `cycle_s` measures); without a cycle, each
2 ms quantum is paid as it is owed."""
from __future__ import annotations

import pytest

from flashwatt.control.pacing import DeviceOps, Pacer


class Board:
    """A host clock that calls and sleeps advance: a call of g seconds is g of busy time
    (the queue drains as it is issued, as on the CPU), a sleep its own length."""

    def __init__(self, duty: float):
        self.t = 0.0
        self.duty = duty
        self.sleeps: list[tuple[float, float]] = []  # (start, seconds) of each slice

    def sleep(self, seconds: float) -> None:
        self.sleeps.append((self.t, seconds))
        self.t += seconds

    def pacer(self, target_cycle_s: float) -> Pacer:
        return Pacer(DeviceOps(None, lambda: self.t), lambda: self.duty, clock=lambda: self.t, sleep=self.sleep,
                     target_cycle_s=target_cycle_s)

    def calls(self, pacer: Pacer, seconds: float, gpu_s: float = 0.001) -> None:
        end = self.t + seconds
        while self.t < end:
            self.t += gpu_s
            pacer.after_call(gpu_s)


def idle_stretches(sleeps: list[tuple[float, float]]) -> list[float]:
    """Consecutive sleep slices joined: the idle stretches the board saw."""
    stretches: list[list[float]] = []
    for start, seconds in sleeps:
        if stretches and abs(stretches[-1][0] + stretches[-1][1] - start) < 1e-9:
            stretches[-1][1] += seconds
        else:
            stretches.append([start, seconds])
    return [s for _, s in stretches]


@pytest.mark.parametrize("duty", [0.3, 0.5, 0.7, 0.9])
def test_calls_idle_in_whole_cycles_at_the_duty(duty):
    board = Board(duty)
    pacer = board.pacer(0.25)
    board.calls(pacer, 5.0)
    stretches = idle_stretches(board.sleeps)
    assert len(stretches) > 10
    # each stretch is one cycle's idle, however the 50 ms slices split it
    assert min(stretches[1:]) == pytest.approx(0.25 * (1 - duty), rel=0.02)
    assert pacer.cycle_s == pytest.approx(0.25, rel=0.02)
    busy = 1 - sum(stretches) / board.t
    assert busy == pytest.approx(duty, abs=0.01)


def test_without_a_cycle_the_debt_is_paid_each_quantum():
    board = Board(0.5)
    pacer = board.pacer(0.0)
    board.calls(pacer, 1.0)
    stretches = idle_stretches(board.sleeps)
    assert max(stretches) == pytest.approx(pacer.quantum_s, rel=0.6)
    assert pacer.cycle_s == 0.0  # the controller reads the instant power


def test_a_cut_in_the_middle_of_a_cycle_idles_at_once():
    """A busy stretch already longer than the new duty's share of a cycle is paid at the
    next call, not at the end of the old duty's cycle."""
    board = Board(0.9)
    pacer = board.pacer(0.25)
    board.calls(pacer, 0.1)  # 0.1 s busy: under the 0.225 s a cycle at 0.9 holds
    assert not board.sleeps
    board.duty = 0.3
    board.calls(pacer, 0.001)
    assert board.sleeps and board.sleeps[0][0] == pytest.approx(0.101, abs=1e-3)
    # 0.1 s of busy time owes 0.1 x 0.7 / 0.3 s at the new duty
    assert sum(idle_stretches(board.sleeps)[:1]) == pytest.approx(0.101 * 0.7 / 0.3, rel=0.02)


def test_full_duty_runs_no_cycle():
    board = Board(0.5)
    pacer = board.pacer(0.25)
    board.calls(pacer, 3.0)
    assert pacer.cycle_s > 0.2
    board.duty = 1.0
    slept = len(board.sleeps)
    board.calls(pacer, 0.5)
    assert len(board.sleeps) == slept
    assert pacer.cycle_s == 0.0  # the controller goes back to the instant reading


def test_a_suite_paces_its_runs_and_oracles_alike_in_cycles():
    """`pace_cycle_s` in a suite's control section (config/overlays/control-cycles.yaml)
    reaches every run and every oracle of the suite, and only where it is set."""
    from flashwatt.config import load_config, validate_config
    from flashwatt.control.job import scenario_of
    from flashwatt.control.suite import control_runs

    plain = control_runs(load_config("config/config.yaml"), "control_heldout")
    assert all("pace_cycle_s" not in spec for spec in plain.values())
    config = validate_config(load_config("config/config.yaml", configfiles=["config/overlays/control-cycles.yaml"]))
    cells = control_runs(config, "control_heldout")
    assert {spec.get("pace_cycle_s") for spec in cells.values()} == {0.25}
    modes = {cell.mode for cell in cells}
    assert {"oracle", "random", "energy"} <= modes
    assert {scenario_of(cell, spec).pace_cycle_s for cell, spec in cells.items()} == {0.25}


def test_a_tenant_that_leaves_while_windows_hold_a_mix_is_let_go():
    """On cycles the loop reads windows of the energy counter; a window in which several
    shapes ran teaches no one table, but the others' watts must still follow it: a tenant
    drawing more than the budget held the duty at its lowest, and once it left the windows
    of the mix (or of nothing, all of it slept) showed an idle board for seconds while its
    watts were still counted (the H200's random-4141-14, 0.06 of the front)."""
    from control_plant import H100_STEADY, H100_WORKLOADS, IDLE_W, LIMIT_W, Plant, simulate
    from flashwatt.control.governor import Governor

    for seed in range(4):
        scenario = {"schedule": [[0.0, 364.0]], "seconds": 6.0, "nvml_failures": [], "mix_change": None,
                    "tenants": [{"kind": "gemm", "intensity": 0.72, "start_s": 0.8, "seconds": 2.5}]}
        gov = Governor("budget", list(H100_STEADY), budget_w=364.0, idle_w=IDLE_W, limit_w=LIMIT_W)
        trace, facts = simulate(scenario, gov, "stream", Plant(H100_STEADY, seed=seed), workloads=H100_WORKLOADS,
                                cycle_s=0.25)
        assert facts.tenants[0]["alone_w"] > 364.0  # the tenant alone is over the budget: the lowest duty
        during = trace[(trace["t"] > 2.0) & (trace["t"] < 3.3)]
        tenant_w = facts.tenants[0]["alone_w"] - IDLE_W  # the tenant is seen, the duty at its lowest
        assert during["offset_w"].max() > 0.5 * tenant_w and during["duty"].min() <= 0.02
        after = trace[trace["t"] >= 3.3 + 1.0]
        assert after["offset_w"].max() < 50.0, seed  # let go within a second of leaving
        assert after["duty"].mean() > 0.2, seed


def test_a_tick_before_the_counter_holds_a_window_is_marked_mid_cycle():
    """`windowed`: with cycles longer than a tick, the counter's average over two cycles once
    it holds them; before that the instant reading marked mid_cycle; as it is without cycles
    or without the energy counter (nothing to window)."""
    from flashwatt.control.counter_power import CounterPower, windowed
    from flashwatt.control.governor import Reading

    no_counter = CounterPower()
    no_counter.add(0.0, None, 0.0)
    assert windowed(no_counter, Reading(0.0, 700.0), 0.25, 0.1) == Reading(0.0, 700.0)  # a board without one
    counter = CounterPower()
    first = Reading(0.0, 700.0, energy_mj=0.0)
    counter.add(0.0, 0.0, 0.0)
    assert windowed(counter, first, 0.25, 0.1).mid_cycle
    assert windowed(counter, first, 0.0, 0.1) == first  # no cycles: the instant reading
    for i in range(1, 6):  # 300 W on average, half the time slept
        counter.add(0.1 * i, 30_000.0 * i, 0.05 * i)
    seen = windowed(counter, Reading(0.5, 120.0, energy_mj=150_000.0), 0.25, 0.1)
    assert not seen.mid_cycle and seen.power_w == pytest.approx(300.0) and seen.duty == pytest.approx(0.5)
    counter.add(0.6, None, 0.3)  # this tick's counter read failed: the window to the last read
    failed = windowed(counter, Reading(0.6, 700.0), 0.25, 0.1)
    assert not failed.mid_cycle and failed.power_w == pytest.approx(300.0)
    for t in (1.1, 1.6):  # and none once that read is more than a window old
        counter.add(t, None, 0.0)
    assert windowed(counter, Reading(1.6, 700.0), 0.25, 0.1).mid_cycle


def test_mid_cycle_ticks_keep_telemetry_alive_without_a_reading():
    """A governor handed only mid-cycle ticks for longer than its staleness limit stays out
    of the fallback (telemetry works) and takes none of those watts as another tenant's."""
    from control_plant import H100_STEADY, IDLE_W, LIMIT_W
    from flashwatt.control.governor import Governor, Reading, Work

    gov = Governor("budget", list(H100_STEADY), budget_w=300.0, idle_w=IDLE_W, limit_w=LIMIT_W)
    shape = (4, 16, 4096, 128)
    for i in range(30):
        work = Work()
        work.add(shape, gov.config_for(shape), 65536)
        row = gov.tick(Reading(0.1 * i, 700.0 if i % 2 else 120.0, energy_mj=1e3 * i, mid_cycle=True), work)
        assert row["phase"] != "fallback" and row["telemetry_ok"], i
    assert gov.offset_w == 0.0 and gov.fallback_reason is None


@pytest.mark.parametrize("seed", range(6))
def test_a_busy_phase_before_the_first_window_is_not_another_tenants_watts(seed):
    """Warm, on cycles of 0.25 s, with no tenant: the instant reading of a busy phase before
    the counter holds two cycles (the run's first half second) drew a cut to the lowest duty
    with 289-396 W taken for another tenant's on the simulated board, and 367 W on an H200."""
    from control_plant import H100_STEADY, H100_WORKLOADS, IDLE_W, LIMIT_W, Plant, simulate
    from flashwatt.control.governor import Governor

    scenario = {"schedule": [[0.0, 366.0], [0.8, 537.0], [1.4, 306.0]], "seconds": 2.0, "nvml_failures": [],
                "mix_change": None, "tenants": []}
    earlier = Governor("budget", list(H100_STEADY), budget_w=366.0, idle_w=IDLE_W, limit_w=LIMIT_W)
    simulate(dict(scenario, seconds=8.0), earlier, "steady", Plant(H100_STEADY, seed=100 + seed),
             workloads=H100_WORKLOADS, cycle_s=0.25)
    gov = Governor("budget", list(H100_STEADY), budget_w=366.0, idle_w=IDLE_W, limit_w=LIMIT_W)
    gov.model = earlier.model  # what a warm start brings
    trace, _ = simulate(scenario, gov, "steady", Plant(H100_STEADY, seed=seed), workloads=H100_WORKLOADS,
                        cycle_s=0.25)
    first = trace[trace["t"] <= 1.0]
    assert first["offset_w"].max() == 0.0
    assert first[first["t"] > 0.2]["duty"].min() > 0.1


def test_a_stalled_read_of_the_counter_ends_no_window():
    """A read that returns the read before's value (the counter stalled; the next read catches
    up) holds the energy of a tick ago: a window ending on it read 0 W for that tick, one
    starting on it counted the tick twice (on the simulated board, after an NVML gap, windows
    read 330-400 W where the board drew 240-280 W). Windows end and start on reads that moved."""
    from flashwatt.control.counter_power import CounterPower

    def filled(stall_at: int) -> CounterPower:
        counter = CounterPower()
        joules = 0.0
        for i in range(11):  # 400 W throughout, read every 0.1 s; one read stalls
            joules += 40.0 * (i > 0)
            counter.add(0.1 * i, (joules - 40.0 if i == stall_at else joules) * 1e3, 0.0)
        return counter

    for stall_at in (10, 5):  # at the window's end, at its start (a window of 0.5 s ending at 1.0 s)
        seen = filled(stall_at).window(1.0, 0.25)
        assert seen is not None and seen.watts == pytest.approx(400.0), stall_at
    steady = filled(-1).window(1.0, 0.25)
    assert steady.watts == pytest.approx(400.0) and steady.seconds == pytest.approx(0.5)
    reset = filled(-1)  # a counter that goes back (a driver reset) starts its windows afresh
    for i, t in enumerate((1.1, 1.2, 1.3, 1.4, 1.5, 1.6)):
        reset.add(t, 40_000.0 * i, 0.0)
        assert (reset.window(t, 0.25) is None) == (t < 1.55)
    assert reset.window(1.6, 0.25).watts == pytest.approx(400.0)
