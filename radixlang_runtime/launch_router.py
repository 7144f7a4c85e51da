"""`python -m radixlang_runtime.launch_router`: the command; the code is in entrypoints/launch_router.py."""

from radixlang_runtime.entrypoints.launch_router import main

if __name__ == "__main__":
    raise SystemExit(main())
