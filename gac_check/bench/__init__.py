"""The benchmark engine: timing (timing.py), what is timed (workloads.py), the machine's own
peak (peak.py), case keys (cases.py), timing kernels into Measurements (kernels.py), and the
device present with its baseline key (device.py).

torch is imported lazily inside functions so that importing the package (the pytest plugin
does) costs nothing.
"""
