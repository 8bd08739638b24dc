"""Rendering results for the agent, as Search-R1 and verl (the APEx tool) do."""

import pytest

from apex_jax.tools import Passage, format_passages, format_results
from apex_jax.tools.passages import CorpusError, parse_line

DOCS = [Passage("1", '"Eiffel Tower"\nA tower in Paris.', 0.9),
        Passage("2", '"Louvre"\nA museum.\nIt holds the Mona Lisa.', 0.5)]


def test_search_r1_style():
  # PeterGriffinJin/Search-R1 `_passages2string`: title line kept as is, then a space and the text
  assert format_passages(DOCS) == ('Doc 1(Title: "Eiffel Tower") A tower in Paris.\n'
                                   'Doc 2(Title: "Louvre") A museum.\nIt holds the Mona Lisa.\n')


def test_verl_style_and_several_queries():
  assert format_passages(DOCS, style="verl") == (
      'Doc 1 (Title: "Eiffel Tower")\nA tower in Paris.\n\n'
      'Doc 2 (Title: "Louvre")\nA museum.\nIt holds the Mona Lisa.')
  assert format_results([DOCS[:1], DOCS[1:]]) == (
      'Doc 1 (Title: "Eiffel Tower")\nA tower in Paris.\n---\n'
      'Doc 1 (Title: "Louvre")\nA museum.\nIt holds the Mona Lisa.')


@pytest.mark.parametrize("style", ["search_r1", "verl"])
@pytest.mark.parametrize("max_chars", [0, 10, 40, 70, 1000])
def test_max_chars_caps_the_whole_string(style, max_chars):
  out = format_passages(DOCS, max_chars, style)
  full = format_passages(DOCS, None, style)
  assert len(out) <= max_chars
  if max_chars >= len(full):
    assert out == full
  elif max_chars >= 40:  # each document keeps its start and is marked as cut
    assert out.count("Doc ") == 2 and "..." in out
  assert len(format_results([DOCS, DOCS], max_chars, style)) <= max(max_chars, 5)


def test_title_and_text():
  assert (DOCS[1].title, DOCS[1].text) == ("Louvre", "A museum.\nIt holds the Mona Lisa.")
  assert Passage("3", "no title line").title == "no title line"
  assert Passage("3", "no title line").text == ""


def test_parse_line_layouts():
  assert parse_line('{"id": 5, "title": "T", "text": "x"}', "f:1") == Passage("5", '"T"\nx')
  assert parse_line('{"id": "a", "contents": "\\"T\\"\\nx", "extra": 1}', "f:1").contents == \
      '"T"\nx'
  with pytest.raises(CorpusError, match="^f:9: field 'id' must be"):
    parse_line('{"id": true, "contents": "x"}', "f:9")


def test_unknown_style():
  with pytest.raises(ValueError, match="style 'xml'"):
    format_passages(DOCS, style="xml")
