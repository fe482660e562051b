"""What to run: options declared once, config files, checks, and the expansion into run specs.

Owns every run option (``options``), reading and validating them from the command line and a TOML/YAML file
and expanding them into one :class:`~petlprof.sweep.spec.RunSpec` per run (``config``), and the spec itself
with its run key (``spec``).  Never imports the run, its execution or the report: a sweep is decided before
any run starts.
"""
