"""Which kernels an engine computes with on this machine: the kernel path the shared files record.

Float results differ between kernels: a BF16 matrix product sums its float32 products in an order
each kernel chooses (AMX tiles, AVX-512 BF16 dot products, oneDNN's blocking, the float32 fallback),
and attention and the elementwise ops are vectorized for the instruction set they run on. The same
weights, prompts and seeds give other samples on a node with other kernels (docs/measurements.md,
"On another instruction set: the AVX2 rerun"). So a file that stands in for an engine's output
(shared rollouts, θ_0's evaluation) records `kernel_path()` of the node that wrote it, and a cell on
a node with another refuses it.

The values (`KERNEL_PATHS`), each from facts this process reads before any engine starts:

- `cuda:sm<major><minor>:<device>`, e.g. `cuda:sm90:nvidia-h200`: the GPU's compute capability
  selects vLLM's attention backend and FP8 kernels (engine.py's docstring) and cuBLAS's GEMM
  kernels; the device name, for cuBLAS's choice by the number of multiprocessors (an H100 and an
  H200 are both SM90).
- `cpu:<linear>:<isa>` on x86, from vLLM-CPU 0.32's own dispatch (model_executor/layers/utils.py,
  `dispatch_cpu_unquantized_gemm`; v1/attention/backends/cpu_attn.py, `_get_attn_isa`;
  platforms/cpu.py, `import_kernels`), which reads the same `torch.cpu._is_*_supported` checks:
  - `<isa>` is `amx` (AMX tiles, for a BF16 engine: vLLM's AMX attention kernel and sgl-kernel's AMX
    GEMM for small weights, oneDNN's AMX kernels for the rest), `avx512_bf16` (AVX-512 with BF16
    dot products: vLLM's `_C` build, its attention's `vec` kernel), `avx512` (`_C_AVX512`), `avx2`
    (`_C_AVX2`) or `default`;
  - `<linear>` is `onednn` (vLLM's oneDNN matmul), `fallback` (oneDNN builds no BF16 matmul below
    AVX-512, and vLLM leaves torch's `F.linear`, which the engine replaces by a float32 sum of the
    BF16 products: engine.bf16_linear_fp32_sum) or `zentorch` (an AMD Zen CPU with AVX-512 and
    zentorch installed: vLLM's Zen platform).
  Two switches change the CPU's kernels without changing the CPU; where set, they are added:
  `:aten_<capability>` where ATen's vectorized kernels run below the instruction set
  (`ATEN_CPU_CAPABILITY`; `torch.backends.cpu.get_cpu_capability()`), `:onednn_max_<isa>` where
  oneDNN is capped (`ONEDNN_MAX_CPU_ISA` / `DNNL_MAX_CPU_ISA`).
- `cpu:other:<machine>` on another architecture (ARM, POWER, s390x, RISC-V: vLLM's kernels there
  are not told apart here).

What vLLM then chose for each linear layer is compared with this at every engine start
(`engine.linear_kernel`, `linear_kernel_mismatch`), and a mismatch is logged. The oneDNN/fallback split
below AVX-512 BF16 is read from vLLM's sources and measured on AVX2 and AVX-512 BF16 EPYCs only; on
AVX-512 without BF16 (`avx512`) and on AMX it is vLLM's code, not a measurement.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re

# the documented forms (a test checks this machine's value is one)
KERNEL_PATHS = (
    r"cuda:sm\d+:[a-z0-9-]+",
    r"cpu:(onednn|fallback|zentorch):(amx|avx512_bf16|avx512|avx2|default)(:aten_[a-z0-9_]+)?(:onednn_max_[a-z0-9_]+)?",
    r"cpu:other:[a-z0-9_]+",
)

# ATen's capability that each instruction set gives by default (torch picks AVX512 where the CPU has it)
ATEN_DEFAULT = {"amx": "avx512", "avx512_bf16": "avx512", "avx512": "avx512", "avx2": "avx2", "default": "default"}


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def cpu_isa(dtype: str = "bfloat16") -> str:
    """The instruction set vLLM-CPU's kernels take for an engine of `dtype` on this x86 CPU (AMX only
    for BF16: vLLM's AMX attention and GEMM take no float32)."""
    import torch

    c = torch.cpu
    if dtype == "bfloat16" and c._is_amx_tile_supported():
        return "amx"
    if c._is_avx512_bf16_supported():
        return "avx512_bf16"
    if c._is_avx512_supported():
        return "avx512"
    if c._is_avx2_supported():
        return "avx2"
    return "default"


def _zen_with_zentorch() -> bool:
    """vLLM's Zen platform: an AMD CPU with AVX-512 (vllm/platforms/__init__.py, `_is_amd_zen_cpu`)
    and zentorch installed."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return False
    return "AuthenticAMD" in info and "avx512" in info and importlib.util.find_spec("zentorch") is not None


def cpu_linear(isa: str, dtype: str = "bfloat16") -> str:
    """The kernel family vLLM-CPU gives an engine's linear layers: `zentorch`, `onednn` or `fallback`."""
    if _zen_with_zentorch():
        return "zentorch"
    if dtype in ("bfloat16", "float16") and isa in ("avx2", "default"):
        return "fallback"  # oneDNN builds no BF16 matmul without AVX-512 (engine.py, "BF16 matrix products")
    return "onednn"


def kernel_path(dtype: str = "bfloat16") -> str:
    """This process's kernel path for an engine of `dtype` (the module's docstring): e.g.
    'cpu:onednn:avx512_bf16', 'cpu:onednn:amx', 'cpu:fallback:avx2', 'cuda:sm90:nvidia-h200'."""
    import torch

    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(i)
        return f"cuda:sm{major}{minor}:{_slug(torch.cuda.get_device_name(i))}"
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"cpu:other:{_slug(machine).replace('-', '_')}"
    isa = cpu_isa(dtype)
    path = f"cpu:{cpu_linear(isa, dtype)}:{isa}"
    aten = torch.backends.cpu.get_cpu_capability().lower().replace(" ", "_")
    if aten != ATEN_DEFAULT[isa]:
        path += f":aten_{aten}"
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if capped:
        path += f":onednn_max_{capped.lower()}"
    return path


# what vLLM may choose for a linear layer under each family of the kernel path: on AMX, small
# weights (< 1 MiB) go to sgl-kernel's AMX GEMM and the rest to oneDNN (vLLM's
# `check_cpu_sgl_kernel`); a layer vLLM skips (meta or non-2-D weights) is `other`
ALLOWED = {"onednn": {"onednn", "other"}, "fallback": {"fallback", "other"}, "zentorch": {"zentorch", "other"}}


def linear_kernel_mismatch(path: str, chosen: dict[str, int]) -> str | None:
    """What is wrong if vLLM gave linear layers of the engine's dtype (`chosen`: family -> count)
    kernels other than the kernel path `path` names, else None. Nodes with the same path still run
    the same kernels (vLLM's dispatch reads the same facts), so a mismatch makes the name wrong, not
    the refusal: the engine logs it, and the tests require none on their machine."""
    if not path.startswith("cpu:") or path.startswith("cpu:other:"):
        return None
    _, family, isa = path.split(":")[:3]
    allowed = ALLOWED[family] | ({"amx"} if isa == "amx" else set())
    wrong = {k: v for k, v in chosen.items() if k not in allowed}
    if not wrong:
        return None
    return (f"kernel path {path!r} (kernels.kernel_path) says {family} linear layers, and vLLM chose "
            + ", ".join(f"{k} for {v}" for k, v in sorted(wrong.items())) + ": kernels.cpu_linear is wrong for this CPU")
