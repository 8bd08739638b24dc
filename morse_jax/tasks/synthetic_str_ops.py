"""Subtask types on strings: transforms (str -> str) and analysis (str -> int or list of ints).

Inputs are ASCII words separated by single spaces (see synthetic_ops.random_str); a "word" is
always defined as a maximal run of non-space characters (Python's `str.split()`), so the
descriptions stay exact even after a transform leaves double spaces behind.
"""

from __future__ import annotations

from morse_jax.tasks.synthetic_ops import make

_WORD = "(a word is a maximal run of non-space characters)"
_VOWEL = "a vowel (a, e, i, o or u, in either case)"
_LETTER = "a letter (a-z or A-Z)"


def _caesar(k, a):
  out = []
  for c in a:
    if "a" <= c <= "z":
      out.append(chr((ord(c) - ord("a") + k) % 26 + ord("a")))
    elif "A" <= c <= "Z":
      out.append(chr((ord(c) - ord("A") + k) % 26 + ord("A")))
    else:
      out.append(c)
  return "".join(out)


def _collapse(a):
  out = []
  for c in a:
    if not out or out[-1] != c:
      out.append(c)
  return "".join(out)


def _letters(a):
  return {c for c in a.lower() if "a" <= c <= "z"}


_CAESAR_CODE = """out = []
for c in {a}:
    if "a" <= c <= "z":
        out.append(chr((ord(c) - ord("a") + {k}) % 26 + ord("a")))
    elif "A" <= c <= "Z":
        out.append(chr((ord(c) - ord("A") + {k}) % 26 + ord("A")))
    else:
        out.append(c)
return "".join(out)"""

TRANSFORM = (
    make("to_upper", "string_transform", "S->S", "`{a}` with every letter in upper case",
         "return {a}.upper()", lambda k, a: a.upper()),
    make("to_lower", "string_transform", "S->S", "`{a}` with every letter in lower case",
         "return {a}.lower()", lambda k, a: a.lower()),
    make("reverse_string", "string_transform", "S->S",
         "`{a}` reversed (its characters in reverse order)",
         "return {a}[::-1]", lambda k, a: a[::-1]),
    make("remove_vowels", "string_transform", "S->S",
         f"`{{a}}` with every character that is {_VOWEL} removed",
         'return "".join(c for c in {a} if c.lower() not in "aeiou")',
         lambda k, a: "".join(c for c in a if c.lower() not in "aeiou")),
    make("swap_case", "string_transform", "S->S",
         "`{a}` with upper-case letters made lower-case and lower-case letters made upper-case",
         "return {a}.swapcase()", lambda k, a: a.swapcase()),
    make("caesar_shift", "string_transform", "S->S",
         "`{a}` with every letter shifted {k} places forward in the alphabet, wrapping around "
         "from z to a and keeping its case; other characters are unchanged",
         _CAESAR_CODE, _caesar, ks=(1, 2, 3, 13), name="caesar_shift_{k}"),
    make("reverse_words", "string_transform", "S->S",
         f"the words of `{{a}}` in reverse order, joined by single spaces {_WORD}",
         'return " ".join(reversed({a}.split()))',
         lambda k, a: " ".join(reversed(a.split()))),
    make("capitalize_words", "string_transform", "S->S",
         "the words of `{a}`, each with its first character in upper case and the rest in lower "
         f"case, joined by single spaces {_WORD}",
         'return " ".join(w.capitalize() for w in {a}.split())',
         lambda k, a: " ".join(w.capitalize() for w in a.split())),
    make("remove_digits", "string_transform", "S->S", "`{a}` with every digit (0-9) removed",
         'return "".join(c for c in {a} if c not in "0123456789")',
         lambda k, a: "".join(c for c in a if c not in "0123456789")),
    make("collapse_repeats", "string_transform", "S->S",
         "`{a}` with every run of equal neighbouring characters replaced by one of them (so "
         '"aabccc" becomes "abc")',
         "out = []\nfor c in {a}:\n    if not out or out[-1] != c:\n        out.append(c)\n"
         'return "".join(out)',
         lambda k, a: _collapse(a)),
    make("join_with_dash", "string_transform", "SS->S",
         "`{a}`, then a hyphen, then `{b}` (`{a} + \"-\" + {b}`)",
         'return {a} + "-" + {b}', lambda k, a, b: a + "-" + b),
    make("take_prefix", "string_transform", "SI->S",
         "the first `{b}` characters of `{a}` (all of `{a}` when it is shorter; an empty string "
         "when `{b}` is zero or negative)",
         "return {a}[:max({b}, 0)]", lambda k, a, b: a[:max(b, 0)]),
)

ANALYSIS = (
    make("count_vowels", "string_analysis", "S->I",
         f"the number of characters of `{{a}}` that are {_VOWEL}",
         'return sum(1 for c in {a} if c.lower() in "aeiou")',
         lambda k, a: sum(1 for c in a if c.lower() in "aeiou")),
    make("count_words", "string_analysis", "S->I", f"the number of words in `{{a}}` {_WORD}",
         "return len({a}.split())", lambda k, a: len(a.split())),
    make("count_uppercase", "string_analysis", "S->I",
         "the number of upper-case letters (A-Z) in `{a}`",
         'return sum(1 for c in {a} if "A" <= c <= "Z")',
         lambda k, a: sum(1 for c in a if "A" <= c <= "Z")),
    make("count_digits", "string_analysis", "S->I", "the number of digits (0-9) in `{a}`",
         'return sum(1 for c in {a} if c in "0123456789")',
         lambda k, a: sum(1 for c in a if c in "0123456789")),
    make("longest_word_length", "string_analysis", "S->I",
         f"the length of the longest word of `{{a}}`, 0 when it has no words {_WORD}",
         "return max((len(w) for w in {a}.split()), default=0)",
         lambda k, a: max((len(w) for w in a.split()), default=0)),
    make("count_distinct_letters", "string_analysis", "S->I",
         f"the number of distinct letters in `{{a}}`, ignoring case (count each character that "
         f"is {_LETTER})",
         'return len(set(c for c in {a}.lower() if "a" <= c <= "z"))',
         lambda k, a: len(_letters(a))),
    make("word_lengths", "string_analysis", "S->L",
         f"the list of the lengths of the words of `{{a}}`, in order {_WORD}",
         "return [len(w) for w in {a}.split()]", lambda k, a: [len(w) for w in a.split()]),
    make("digit_values", "string_analysis", "S->L",
         "the digits (0-9) that occur in `{a}`, in order, as integers",
         'return [int(c) for c in {a} if c in "0123456789"]',
         lambda k, a: [int(c) for c in a if c in "0123456789"]),
    make("vowel_positions", "string_analysis", "S->L",
         f"the indices of the characters of `{{a}}` that are {_VOWEL}, in increasing order",
         'return [i for i, c in enumerate({a}) if c.lower() in "aeiou"]',
         lambda k, a: [i for i, c in enumerate(a) if c.lower() in "aeiou"]),
    make("shared_letter_count", "string_analysis", "SS->I",
         "the number of distinct letters (a-z, ignoring case) that occur in both `{a}` and `{b}`",
         'left = set(c for c in {a}.lower() if "a" <= c <= "z")\n'
         'right = set(c for c in {b}.lower() if "a" <= c <= "z")\n'
         "return len(left & right)",
         lambda k, a, b: len(_letters(a) & _letters(b))),
)
