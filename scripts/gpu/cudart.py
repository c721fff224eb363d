"""The CUDA runtime as a program's own calls resolve it, for the scripts that call it by ctypes."""
import ctypes


def cudart(symbol):
    """The library whose `symbol` the process resolves first: the process itself (zrtier's hook,
    under LD_PRELOAD) when it exports the symbol, else the loaded libcudart."""
    glob = ctypes.CDLL(None)
    if hasattr(glob, symbol):
        return glob
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcudart.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("libcudart is not loaded")
