"""The power-aware scheduler: a closed loop that holds a power budget or minimises energy.

Knobs are all on the workload's side (backend and tile, CTAs in flight, pacing, chunking,
precision where the user opts in); no device setting is ever changed. See
`flashwatt.control.controller.Controller` for the API and docs/control.md for the method.
"""
from flashwatt.control.configuration import Configuration, ControlError

__all__ = ["Configuration", "ControlError", "Controller"]


def __getattr__(name: str):
    if name == "Controller":  # torch is imported only by whoever runs the controller
        from flashwatt.control.controller import Controller

        return Controller
    raise AttributeError(name)
