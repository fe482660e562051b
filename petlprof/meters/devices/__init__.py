"""Hardware access for the meters, one module per vendor interface: :mod:`.nvml` (NVIDIA GPUs) and
:mod:`.rapl` (CPU package and DRAM counters under powercap).  The energy meters, the power sampler
and the idle baseline read the hardware only through these modules."""
