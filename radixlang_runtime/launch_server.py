"""`python -m radixlang_runtime.launch_server`: the command; the code is in entrypoints/launch_server.py."""

from radixlang_runtime.entrypoints.launch_server import main

if __name__ == "__main__":
    raise SystemExit(main())
