"""Where and when a run ran, as results.json records it beside the code (versions.py): the
machine its timings and bf16 results depend on, the day, and the command that started it.
A sweep's summary names its runs' own (posbench/report/summary.py), not the summary writer's."""

from __future__ import annotations

import os
import platform
from datetime import date
from pathlib import Path
from typing import Any

import torch

from posbench.system.precision import bf16_hardware


def machine_description() -> str:
    """``AMD EPYC family 25 model 17 (x86_64, 2 cores, bf16: avx512_bf16), torch 2.13.0+cpu``:
    what timings and bf16 results depend on."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # Linux: the first processor's name, family and model
        fields = dict(
            (key.strip(), value.strip())
            for key, _, value in (line.partition(":") for line in cpuinfo.read_text().splitlines())
            if value
        )
        model = fields.get("model name", model)
        if "cpu family" in fields and "model" in fields:
            model += f" family {fields['cpu family']} model {fields['model']}"
    bf16 = bf16_hardware(torch.device("cpu")) or "none"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model} ({platform.machine()}, {cores} cores, bf16: {bf16}), torch {torch.__version__}"


def ran(command: str | None) -> dict[str, Any]:
    """results.json's ``ran`` (and a re-evaluated record's): the ``command`` that started it
    (None where the caller knows none: the Python API), this machine and today's date."""
    return {"command": command, "machine": machine_description(), "date": date.today().isoformat()}
