"""roseinfer: a small, fast LLM inference engine."""

from roseinfer.entrypoints.llm import LLM, InvalidRequestError
from roseinfer.logprobs import Logprob
from roseinfer.outputs import CompletionOutput, RequestOutput
from roseinfer.sampling_params import RequestOutputKind, SamplingParams

__all__ = [
    "LLM",
    "SamplingParams",
    "RequestOutputKind",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "InvalidRequestError",
]
__version__ = "0.1.0"
