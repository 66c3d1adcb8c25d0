"""Stand-in for torchaudio inside the LLaMA-Factory venv (scripts/setup-llamafactory.sh).

LLaMA-Factory's data/mm_plugin.py imports torchaudio at module level but uses it only for
audio inputs, which tests/test_recipe_llamafactory.py never gives.  PyPI's torchaudio
builds load only beside their own torch release, and none matches the CPU torch 2.13
wheel the venv uses, so the real one cannot be installed there.  Any use fails loudly.
"""


def __getattr__(name):
    raise RuntimeError(f"torchaudio.{name}: audio is not supported in the LLaMA-Factory test venv")
