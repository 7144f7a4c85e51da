"""`python -m radixlang_runtime.demo`: the command; the code is in entrypoints/demo.py."""

from radixlang_runtime.entrypoints.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
