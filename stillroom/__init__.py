"""Stillroom: reproducible distillation pipelines, from prompt pools to paper tables."""

import logging

__version__ = "0.1.0"

# Load messages of optional kernels that no stage needs, logged as warnings by the libraries on
# import and alarming in every job log: torchao's prebuilt CUDA extensions (_C_mxfp8, built for
# CPython 3.10, and _C_cutlass_90a) on a CPU torch; bitsandbytes' CPU 4-bit GEMM, which it fetches
# from the hub's kernels-community (offline in jobs: it falls back to its own), and the kernels
# package's note on that fetch; torch's deprecation of torchao's Enum registrations. Dropped by
# message on the logger that says each, so every other warning stays.
HARMLESS = {
    "torchao": ("Failed to load ", "/torchao/_C"),
    "bitsandbytes.backends.cpu.ops": (
        "Failed to load CPU gemm_4bit_forward from kernels-community",
    ),
    "kernels._internals.hf_hub": (
        "Skipping publisher trust check for 'kernels-community/",
        "Hugging Face Hub is in offline mode",
    ),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported by torch.compile",),
}


def _keep(logger: str, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not all(part in message for part in HARMLESS[logger])


for _name in HARMLESS:
    logging.getLogger(_name).addFilter(lambda record, name=_name: _keep(name, record))
