"""roseinfer: a small, fast LLM inference engine."""

from roseinfer.entrypoints.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
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
    "BeamSearchParams",
    "BeamSearchOutput",
    "BeamSearchSequence",
]
__version__ = "0.1.0"
