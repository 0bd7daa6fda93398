"""Loaded by every Python process of a broker the fault battery starts with this directory on
PYTHONPATH: records each fsync's file and size (odradek.chaos.fsync_trace)."""
try:
    from odradek.chaos.fsync_trace import install
    install()
except ImportError:
    pass
