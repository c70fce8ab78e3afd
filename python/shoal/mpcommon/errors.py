"""The exceptions of the pipeline runtime.

Every message starts with ``smp:`` and names what was wrong: the config key,
the module, the rank. Errors that one rank raises while the others wait for it
reach the others as :class:`SMPRemoteError` naming the rank that failed (see
failure.py).
"""


class SMPError(Exception):
    """Base class of every error raised by shoal.modelparallel."""


class SMPConfigError(SMPError, ValueError):
    """An unknown, invalid or inconsistent configuration key."""


class SMPUnsupportedError(SMPError, NotImplementedError):
    """A feature of the SageMaker library that shoal does not implement."""


class SMPValidationError(SMPError, RuntimeError):
    """The API was used in a way the runtime cannot serve (e.g. the model
    called outside an ``@smp.step`` function, a batch that does not split)."""


class SMPTraceError(SMPError, RuntimeError):
    """A model whose forward cannot be turned into pipeline stages."""


class SMPRemoteError(SMPError, RuntimeError):
    """Another rank failed; the message is that rank's error."""
