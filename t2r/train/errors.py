"""Errors that stop a run on purpose. Each message says what happened, where, and what to do; the
command line prints it without a traceback and exits non-zero."""


class RunError(RuntimeError):
    """A run that cannot start or go on."""


class RunDirError(RunError):
    """The checkpoint directory is busy (another run holds its lock) or holds another run's outputs."""


class CheckpointError(RunError):
    """No checkpoint can be resumed from: damaged, unsafe to load, or made by an incompatible recipe."""


class NonFiniteError(RunError):
    """The loss or gradient norm stayed non-finite (nan / inf) for too many optimizer steps in a row,
    or the weights themselves became non-finite; nothing non-finite was saved."""


class CollapseError(RunError):
    """The loss jumped far above where the stage started, or fell back to a uniform guess, and stayed there;
    the last good checkpoint was kept and no final model written."""
