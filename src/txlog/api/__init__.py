"""The user's front door: ``Log``, composed of a ``txlog.root.root.Root``."""
