"""Thread names for /proc readers (the engine's and the Triton model's threads)."""


def name_os_thread(name: str) -> None:
    """Give the calling thread its name in /proc (Python 3.11 names only its own Thread objects): in a
    python-backend stub every thread is otherwise `triton_python_b`, and per-thread CPU cannot be told apart."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass  # not Linux: the name is only for /proc readers
