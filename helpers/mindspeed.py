"""MindSpeed-LLM beside chapter 06's ladder (layer: chapter studies; taught in 06_optimization_ladder):
detected, never assumed. When it is absent the chapter shows the exact commands for an Ascend
machine instead of a number; a configured generate script can be run as it is and its wall time
reported apart from the rungs.
Serving engines (vLLM, vLLM-Ascend) are chapter 07's (``helpers.serving``).
"""
from __future__ import annotations

import importlib.util
import time

from .prose import Message, N_, translate_cell


MINDSPEED_COMMANDS = N_("""\
# MindSpeed-LLM is a Megatron-based training suite; its inference is a validation script.
# Use a release branch that still ships the 7B script (1.0.RC3 ... 26.0.0; master keeps only 13B).
source /usr/local/Ascend/ascend-toolkit/set_env.sh   # or /usr/local/Ascend/cann/set_env.sh on CANN >= 8.5
git clone -b 2.3.0 <MindSpeed-LLM repository> && cd MindSpeed-LLM
# 1. convert the Hugging Face checkpoint to the mcore layout once (convert_ckpt.py, see the branch's docs)
# 2. set CHECKPOINT and TOKENIZER_PATH in the script; it passes --use-mcore-models --use-kv-cache
#    --use-flash-attn --use-fused-swiglu --use-fused-rmsnorm --fp16 --tensor-model-parallel-size 1
bash examples/mcore/llama2/generate_llama2_7b_ptd.sh
# 13B / 70B: the matching generate_llama2_*_ptd.sh with --tensor-model-parallel-size 2 / 8
""")


def detect_frameworks() -> list[dict]:
    """MindSpeed-LLM: installed or not, its real entry point, and the commands for an Ascend machine
    (serving engines are chapter 07's, ``helpers.serving``)."""
    try:
        found = importlib.util.find_spec("mindspeed_llm") is not None
    except (ImportError, ValueError):
        found = False
    return [{"framework": "MindSpeed-LLM", "module": "mindspeed_llm",
             "status": "installed" if found else "not installed here",
             "entry_point": "inference.py via examples/mcore/llama2/generate_llama2_7b_ptd.sh",
             "commands": Message(MINDSPEED_COMMANDS)}]


def framework_commands(row, lang: str = "en") -> str:
    """A ``detect_frameworks`` row's commands under a heading with its status, for a reader of ``lang``."""
    return (f"# --- {row['framework']} ({translate_cell(row['status'], lang)}) ---\n"
            f"{translate_cell(row['commands'], lang)}")


def run_script(path: str, parameter: str = "script", timeout: float = 3600.0) -> dict:
    """Run a shell script as it is (e.g. MindSpeed-LLM's generate_llama2_7b_ptd.sh), timing its wall.

    The time includes everything the script does (checkpoint loading, distributed start-up), so it
    is reported apart from the ladder's rungs.
    """
    import subprocess
    from pathlib import Path

    script = Path(path).expanduser()
    if not script.is_file():
        raise ValueError(f"{parameter}={path!r} is not a file; give the path of a configured "
                         "generate script, or leave it empty")
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(script)], cwd=str(script.parent), capture_output=True,
                          text=True, timeout=timeout)
    wall = time.perf_counter() - start
    output = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode != 0:
        raise RuntimeError(f"{parameter}={path!r} exited with {proc.returncode}:\n{output}")
    return {"wall_s": wall, "returncode": proc.returncode, "output_tail": output}
