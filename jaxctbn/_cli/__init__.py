"""The `jaxctbn` command line, one file per command, and the JAX process setup."""

from .main import main as main


def console() -> None:
    """The `jaxctbn` console script: the allocator, BLAS-thread and garbage-collection
    settings of the command's own process (`jax_setup.fix_malloc_mmap_threshold` at
    `jax_setup.mmap_threshold_for` the command,
    `jax_setup.use_one_blas_thread`, `jax_setup.fewer_garbage_collections`), then `main`'s
    exit status, without the interpreter's teardown (`jax_setup.exit_without_teardown`).
    Calling `main` in a Python process changes none of them."""
    import sys

    from .jax_setup import (
        exit_without_teardown,
        fewer_garbage_collections,
        fix_malloc_mmap_threshold,
        mmap_threshold_for,
        use_one_blas_thread,
    )

    fewer_garbage_collections()
    fix_malloc_mmap_threshold(mmap_threshold_for(sys.argv[1:]))
    use_one_blas_thread()
    exit_without_teardown(main())
