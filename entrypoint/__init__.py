"""Turn the environment a platform gives one node into a launch plan, then start the trainer."""

__version__ = "0.1.0"

# The stopping signals `python -m entrypoint` took before a command had handlers of its own
# (entrypoint/__main__.py). Its handler raises, and Python drops an exception raised where it
# cannot propagate (a __del__, a finalizer: "Exception ignored in ..."); `run` takes what is
# recorded here as received, so that such a signal is never lost.
early_signals: list[int] = []
