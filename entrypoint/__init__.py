"""Turn the environment a platform gives one node into a launch plan, then start the trainer."""

__version__ = "0.1.0"
