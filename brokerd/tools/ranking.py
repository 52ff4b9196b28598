"""Ranking the catalogue for a ``find_tool`` query: a pure, explainable score.

score = NAME_WEIGHT * (query words found in the tool's name)
      + DESCRIPTION_WEIGHT * (query words found in its description)

Words are lower-case runs of letters and digits (``web_fetch`` is ``web`` and ``fetch``), a plural
``s`` is dropped, and a few filler words are ignored. A tool that shares no word with the query
is not returned. Ties are broken by name so the order never depends on file order.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from brokerd.tools.catalogue import ToolSpec

NAME_WEIGHT = 3
DESCRIPTION_WEIGHT = 1
# "tool" is filler too: a query is always about a tool.
STOPWORDS = frozenset(
    {"a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "how", "i", "in", "into"}
    | {"is", "it", "me", "my", "of", "on", "or", "the", "this", "to", "tool", "what", "with"}
)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class RankedTool:
    """A tool with its score and the words that earned it (so a ranking can be explained)."""

    spec: ToolSpec
    score: int
    name_hits: frozenset[str]
    description_hits: frozenset[str]


def words(text: str) -> frozenset[str]:
    """The normalised words of ``text`` used for matching."""
    return frozenset(
        _singular(word) for word in _WORD.findall(text.lower()) if word not in STOPWORDS
    )


def score_tool(query_words: frozenset[str], spec: ToolSpec) -> RankedTool:
    name_hits = query_words & words(spec.name)
    description_hits = query_words & words(spec.description)
    score = NAME_WEIGHT * len(name_hits) + DESCRIPTION_WEIGHT * len(description_hits)
    return RankedTool(spec, score, name_hits, description_hits)


def rank(query: str, tools: Iterable[ToolSpec], limit: int) -> list[RankedTool]:
    """The best ``limit`` tools for ``query``, best first; tools scoring 0 are left out."""
    query_words = words(query)
    scored = [score_tool(query_words, spec) for spec in tools]
    matching = [ranked for ranked in scored if ranked.score > 0]
    matching.sort(key=lambda ranked: (-ranked.score, ranked.spec.name))
    return matching[:limit]


def _singular(word: str) -> str:
    # Only the plainest plural: "pages" -> "page", "logs" -> "log"; "status" and "ss" stay.
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us")):
        return word[:-1]
    return word
