"""The executor's tools: dense passage search (faiss index, Search-R1 HTTP protocol, client),
term-overlap search in process (`overlap`: the synthetic world's) and parsing of its tool calls.

Heavy imports (faiss, sentence-transformers) happen only when an index is built or opened.
"""

from apex_jax.tools.passages import CorpusError, Passage, format_passages, format_results
from apex_jax.tools.protocol import (FORMAT_ERRORS, Answer, FormatError, ToolCall, parse_turn,
                                     render_tool_call)
from apex_jax.tools.search import (LocalSearch, SearchClient, SearchError, Searcher,
                                   SearchRequestError, SearchTimeout, SearchUnavailable,
                                   TokenBucket)

__all__ = ["CorpusError", "Passage", "format_passages", "format_results", "FORMAT_ERRORS",
           "Answer", "FormatError", "ToolCall", "parse_turn", "render_tool_call", "LocalSearch",
           "SearchClient", "SearchError", "Searcher", "SearchRequestError", "SearchTimeout",
           "SearchUnavailable", "TokenBucket"]
