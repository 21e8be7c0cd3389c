"""goodput.testbed: what tests, benchmarks and the demo run goodput against, never shipped with it.

The local control plane with fake GPU nodes (`cluster/`), the live vLLM emulator behind real pod IPs,
the open-loop load generator, the operator as a child process with stand-ins for its peers, and the
demo. It may import every layer of goodput; nothing in goodput imports it.
"""
