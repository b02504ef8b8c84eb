"""The shared files (rollouts, θ_0's evaluation) name their model by its weights' hash and their
node by its kernel path (dlcrepro/step/weights.py, dlcrepro/step/kernels.py, stamped.model_and_kernels)."""

import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, SMOKE
from dlcrepro.study import initial_eval, rollouts
from dlcrepro.step import kernels, stamped, weights
from dlcrepro.core.config import ConfigError
from dlcrepro.step.engine import Rollout

ONE = Rollout(prompt_ids=[[1, 2]], response_ids=[[3]], group=torch.zeros(1, dtype=torch.long),
              engine_logp=torch.zeros(1), topk_ids=None, topk_logp=None, version=0)


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        line = next(ln for ln in f if ln.startswith("flags"))
    return set(line.split(":", 1)[1].split())


def test_the_kernel_path_here_is_one_of_the_documented_values():
    path = kernels.kernel_path("bfloat16")
    assert any(re.fullmatch(p, path) for p in kernels.KERNEL_PATHS), path
    if not torch.cuda.is_available() and path.startswith("cpu:") and not path.startswith("cpu:other:"):
        # the instruction set is the CPU's, as the kernel reports it
        flags = cpu_flags()
        isa = ("amx" if "amx_tile" in flags else "avx512_bf16" if "avx512_bf16" in flags else
               "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags else "avx2" if "avx2" in flags else "default")
        assert path.split(":")[2] == isa
        assert path.split(":")[1] in (("fallback", "zentorch") if isa in ("avx2", "default") else ("onednn", "zentorch"))


def test_same_weights_at_another_path_read_the_shared_files(tiny_model_dir, smoke_cfg, tmp_path):
    """A moved checkout, or another node's copy of the same weights: the files are read."""
    moved = shutil.copytree(tiny_model_dir, tmp_path / "elsewhere" / "model")
    assert weights.weights_hash(moved) == weights.weights_hash(tiny_model_dir)
    ident = rollouts.identity(smoke_cfg, "tiny", "stale", 0, tiny_model_dir, 0)
    rollouts.save(tmp_path / "r.pt", ident, {1: ONE})
    read = rollouts.load(tmp_path / "r.pt", rollouts.identity(smoke_cfg, "tiny", "stale", 0, moved, 0), 0)
    assert read[1].response_ids == [[3]]
    stamped.write(tmp_path / "i.json", initial_eval.identity(smoke_cfg, "tiny", 0, tiny_model_dir), "accuracies",
                  {"test_accuracy": 0.25}, as_json=True)
    want = initial_eval.identity(smoke_cfg, "tiny", 0, moved)
    assert initial_eval.load_initial_eval(tmp_path / "i.json", want) == {"test_accuracy": 0.25}


def test_other_weights_at_the_same_path_are_refused_naming_the_weights_hash(tiny_model_dir, smoke_cfg, tmp_path):
    from safetensors.torch import load_file, save_file

    mdir = shutil.copytree(tiny_model_dir, tmp_path / "model")
    before = weights.weights_hash(mdir)
    ident = rollouts.identity(smoke_cfg, "tiny", "stale", 0, mdir, 0)
    rollouts.save(tmp_path / "r.pt", ident, {1: ONE})
    (file,) = mdir.glob("*.safetensors")
    state = load_file(file)
    name = sorted(state)[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] += 1  # one number of one tensor: another warm start at the same path
    save_file(state, file, metadata={"format": "pt"})
    after = weights.weights_hash(mdir)
    assert after != before
    with pytest.raises(ConfigError, match=rf"r\.pt holds rollouts of another run: weights differ \(weights\.weights_sha256: "
                                          rf"'{before}' there, '{after}' here\); it was computed from other weights"):
        rollouts.load(tmp_path / "r.pt", rollouts.identity(smoke_cfg, "tiny", "stale", 0, mdir, 0), 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ATen's CPU capability does not change a GPU's kernel path")
def test_a_file_of_a_node_with_other_kernels_is_refused_naming_both(tiny_model_dir, smoke_cfg, tmp_path):
    """A process with ATen's kernels held to AVX2 (as on an AVX2 node) writes the θ_0 file; this
    process, with its own kernels, refuses it and names the file and both kernel paths."""
    path = tmp_path / "seed0.json"
    write = ("import sys; from dlcrepro.study import initial_eval; from dlcrepro.step import stamped; "
             "from dlcrepro.core.config import load; "
             "stamped.write(sys.argv[1], initial_eval.identity(load(sys.argv[2]), 'tiny', 0, sys.argv[3]), 'accuracies', "
             "{'test_accuracy': 0.25}, as_json=True)")
    env = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", write, str(path), str(SMOKE), str(tiny_model_dir)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    here = kernels.kernel_path(smoke_cfg.engine.dtype)
    there = stamped.read(path, "accuracies", "θ_0 evaluation", as_json=True)[0]["kernel_path"]
    assert there != here and there.endswith(":onednn_max_avx2")
    with pytest.raises(ConfigError) as e:
        initial_eval.load_initial_eval(path, initial_eval.identity(smoke_cfg, "tiny", 0, tiny_model_dir))
    assert str(e.value).startswith(f"{path} holds θ_0's evaluation of another run: kernel_path differ "
                                   f"(kernel_path: {there!r} there, {here!r} here); it was computed on a node with other kernels")
