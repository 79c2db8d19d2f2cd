"""The `jaxctbn` command line, one file per command, and the JAX process setup."""

from .main import main as main


def console() -> None:
    """The `jaxctbn` console script: the allocator setting of the command's own process
    (`jax_setup.fix_malloc_mmap_threshold`), then `main`'s exit status.
    Calling `main` in a Python process changes no allocator setting."""
    import sys

    from .jax_setup import fix_malloc_mmap_threshold

    fix_malloc_mmap_threshold()
    sys.exit(main())
