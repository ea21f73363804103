"""Device runtimes: one `ops_<name>.py` module per device, each defining a `<NAME>Device(Compiled)` class."""
