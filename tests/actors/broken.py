"""An actor module that fails at import (not with ImportError): the fork server that
preloads it dies, and the supervisor must fall back to spawn and report the actor."""
raise RuntimeError("broken at import, on purpose")
