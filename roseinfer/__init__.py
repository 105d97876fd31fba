"""roseinfer: a small, fast LLM inference engine."""

from roseinfer.entrypoints.llm import LLM, InvalidRequestError
from roseinfer.logprobs import Logprob
from roseinfer.outputs import CompletionOutput, RequestOutput
from roseinfer.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "InvalidRequestError"]
__version__ = "0.1.0"
