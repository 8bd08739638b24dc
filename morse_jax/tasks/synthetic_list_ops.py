"""Subtask types on integer lists and integers: filtering, arithmetic, ordering, number math.

Every op says what it does on edge cases (an empty list, a list too short), because the unit
tests always include the empty input.
"""

from __future__ import annotations

from morse_jax.tasks.synthetic_ops import make


def _unique(a):
  out = []
  for x in a:
    if x not in out:
      out.append(x)
  return out


def _prefix_sums(a):
  out, total = [], 0
  for x in a:
    total += x
    out.append(total)
  return out


def _rotate(k, a):
  if not a:
    return []
  n = k % len(a)
  return a[n:] + a[:n]


def _interleave(a, b):
  out = []
  for i in range(max(len(a), len(b))):
    out += a[i:i + 1] + b[i:i + 1]
  return out


_IN_ORDER = "in their original order"

FILTER = (
    make("keep_even", "list_filter", "L->L",
         f"the elements of `{{a}}` that are even, {_IN_ORDER}",
         "return [x for x in {a} if x % 2 == 0]",
         lambda k, a: [x for x in a if x % 2 == 0]),
    make("keep_odd", "list_filter", "L->L",
         f"the elements of `{{a}}` that are odd, {_IN_ORDER}",
         "return [x for x in {a} if x % 2 != 0]",
         lambda k, a: [x for x in a if x % 2 != 0]),
    make("keep_positive", "list_filter", "L->L",
         f"the elements of `{{a}}` that are greater than zero, {_IN_ORDER}",
         "return [x for x in {a} if x > 0]",
         lambda k, a: [x for x in a if x > 0]),
    make("keep_greater_than", "list_filter", "L->L",
         f"the elements of `{{a}}` that are greater than {{k}}, {_IN_ORDER}",
         "return [x for x in {a} if x > {k}]",
         lambda k, a: [x for x in a if x > k], ks=(0, 1, 2, 3, 4), name="keep_greater_than_{k}"),
    make("drop_multiples", "list_filter", "L->L",
         f"the elements of `{{a}}` that are not divisible by {{k}} (0 is divisible), {_IN_ORDER}",
         "return [x for x in {a} if x % {k} != 0]",
         lambda k, a: [x for x in a if x % k != 0], ks=(2, 3, 4), name="drop_multiples_of_{k}"),
    make("unique_values", "list_filter", "L->L",
         "the elements of `{a}` with repeated values removed: each value is kept only where it "
         f"first occurs, {_IN_ORDER}",
         "out = []\nfor x in {a}:\n    if x not in out:\n        out.append(x)\nreturn out",
         lambda k, a: _unique(a)),
    make("keep_even_positions", "list_filter", "L->L",
         f"the elements of `{{a}}` at even indices (0, 2, 4, ...), {_IN_ORDER}",
         "return {a}[::2]",
         lambda k, a: a[::2]),
    make("drop_ends", "list_filter", "L->L",
         "`{a}` without its first and last elements (an empty list when `{a}` has fewer than "
         "three elements)",
         "return {a}[1:-1]",
         lambda k, a: a[1:-1]),
    make("common_values", "list_filter", "LL->L",
         f"the elements of `{{a}}` that also occur in `{{b}}`, {_IN_ORDER} (repeats in `{{a}}` "
         "are kept)",
         "return [x for x in {a} if x in {b}]",
         lambda k, a, b: [x for x in a if x in b]),
    make("keep_above", "list_filter", "LI->L",
         f"the elements of `{{a}}` that are greater than `{{b}}`, {_IN_ORDER}",
         "return [x for x in {a} if x > {b}]",
         lambda k, a, b: [x for x in a if x > b]),
)

MATH = (
    make("double_each", "list_math", "L->L", "`{a}` with every element multiplied by 2",
         "return [2 * x for x in {a}]", lambda k, a: [2 * x for x in a]),
    make("square_each", "list_math", "L->L", "`{a}` with every element squared",
         "return [x * x for x in {a}]", lambda k, a: [x * x for x in a]),
    make("add_to_each", "list_math", "L->L", "`{a}` with {k} added to every element",
         "return [x + {k} for x in {a}]", lambda k, a: [x + k for x in a],
         ks=(1, 2, 3, 5, 10), name="add_{k}_to_each"),
    make("abs_each", "list_math", "L->L",
         "`{a}` with every element replaced by its absolute value",
         "return [abs(x) for x in {a}]", lambda k, a: [abs(x) for x in a]),
    make("prefix_sums", "list_math", "L->L",
         "the running totals of `{a}`: element i is the sum of the first i + 1 elements of `{a}`",
         "out = []\ntotal = 0\nfor x in {a}:\n    total += x\n    out.append(total)\nreturn out",
         lambda k, a: _prefix_sums(a)),
    make("pairwise_differences", "list_math", "L->L",
         "the differences of neighbouring elements of `{a}`: element i is `{a}[i + 1] - {a}[i]` "
         "(an empty list when `{a}` has fewer than two elements)",
         "return [{a}[i + 1] - {a}[i] for i in range(len({a}) - 1)]",
         lambda k, a: [a[i + 1] - a[i] for i in range(len(a) - 1)]),
    make("sum_values", "list_math", "L->I", "the sum of the elements of `{a}` (0 for an empty list)",
         "return sum({a})", lambda k, a: sum(a)),
    make("max_value", "list_math", "L->I", "the largest element of `{a}` (0 for an empty list)",
         "return max({a}) if {a} else 0", lambda k, a: max(a) if a else 0),
    make("min_value", "list_math", "L->I", "the smallest element of `{a}` (0 for an empty list)",
         "return min({a}) if {a} else 0", lambda k, a: min(a) if a else 0),
    make("count_values", "list_math", "L->I", "the number of elements of `{a}`",
         "return len({a})", lambda k, a: len(a)),
    make("value_range", "list_math", "L->I",
         "the largest element of `{a}` minus its smallest element (0 for an empty list)",
         "return max({a}) - min({a}) if {a} else 0", lambda k, a: max(a) - min(a) if a else 0),
    make("zip_sum", "list_math", "LL->L",
         "the element-wise sums of `{a}` and `{b}`: element i is `{a}[i] + {b}[i]`, for every i "
         "below the length of the shorter list",
         "return [x + y for x, y in zip({a}, {b})]",
         lambda k, a, b: [x + y for x, y in zip(a, b)]),
    make("add_number_to_each", "list_math", "LI->L", "`{a}` with `{b}` added to every element",
         "return [x + {b} for x in {a}]", lambda k, a, b: [x + b for x in a]),
    make("dot_product", "list_math", "LL->I",
         "the sum of `{a}[i] * {b}[i]` over every i below the length of the shorter list (0 when "
         "either list is empty)",
         "return sum(x * y for x, y in zip({a}, {b}))",
         lambda k, a, b: sum(x * y for x, y in zip(a, b))),
)

ORDER = (
    make("sort_ascending", "list_order", "L->L", "`{a}` sorted in ascending order",
         "return sorted({a})", lambda k, a: sorted(a)),
    make("sort_descending", "list_order", "L->L", "`{a}` sorted in descending order",
         "return sorted({a}, reverse=True)", lambda k, a: sorted(a, reverse=True)),
    make("reverse_list", "list_order", "L->L", "the elements of `{a}` in reverse order",
         "return {a}[::-1]", lambda k, a: a[::-1]),
    make("rotate_left", "list_order", "L->L",
         "`{a}` rotated left {k} times (each time, the first element moves to the end); an "
         "empty list stays empty",
         "if not {a}:\n    return []\nn = {k} % len({a})\nreturn {a}[n:] + {a}[:n]",
         _rotate, ks=(1, 2, 3), name="rotate_left_{k}"),
    make("sort_by_abs", "list_order", "L->L",
         "`{a}` sorted by absolute value, smallest first; elements with equal absolute values "
         "keep their original order",
         "return sorted({a}, key=abs)", lambda k, a: sorted(a, key=abs)),
    make("evens_first", "list_order", "L->L",
         "the even elements of `{a}` followed by its odd elements, each group in its original "
         "order",
         "return [x for x in {a} if x % 2 == 0] + [x for x in {a} if x % 2 != 0]",
         lambda k, a: [x for x in a if x % 2 == 0] + [x for x in a if x % 2 != 0]),
    make("largest_values", "list_order", "L->L",
         "the {k} largest elements of `{a}` in descending order (all of them, in descending "
         "order, when `{a}` has fewer than {k} elements)",
         "return sorted({a}, reverse=True)[:{k}]", lambda k, a: sorted(a, reverse=True)[:k],
         ks=(2, 3), name="largest_{k}_values"),
    make("concat_lists", "list_order", "LL->L",
         "the elements of `{a}` followed by the elements of `{b}`",
         "return {a} + {b}", lambda k, a, b: a + b),
    make("interleave_lists", "list_order", "LL->L",
         "the elements of `{a}` and `{b}` taken alternately, starting with the first element of "
         "`{a}`; when one list runs out, the rest of the other follows",
         "out = []\nfor i in range(max(len({a}), len({b}))):\n    if i < len({a}):\n"
         "        out.append({a}[i])\n    if i < len({b}):\n        out.append({b}[i])\n"
         "return out",
         lambda k, a, b: _interleave(a, b)),
)

NUMBER = (
    make("digit_sum", "number_math", "I->I",
         "the sum of the decimal digits of the absolute value of `{a}`",
         "return sum(int(c) for c in str(abs({a})))",
         lambda k, a: sum(int(c) for c in str(abs(a)))),
    make("square_number", "number_math", "I->I", "`{a}` squared (`{a} * {a}`)",
         "return {a} * {a}", lambda k, a: a * a),
    make("last_digit", "number_math", "I->I",
         "the last decimal digit of the absolute value of `{a}`",
         "return abs({a}) % 10", lambda k, a: abs(a) % 10),
    make("negate_number", "number_math", "I->I", "`{a}` with its sign flipped (`-{a}`)",
         "return -{a}", lambda k, a: -a),
    make("halve_number", "number_math", "I->I",
         "`{a}` divided by 2 and rounded down (`{a} // 2` in Python)",
         "return {a} // 2", lambda k, a: a // 2),
    make("plus", "number_math", "I->I", "`{a}` plus {k}", "return {a} + {k}",
         lambda k, a: a + k, ks=(1, 2, 3, 7), name="plus_{k}"),
    make("add_numbers", "number_math", "II->I", "the sum `{a} + {b}`", "return {a} + {b}",
         lambda k, a, b: a + b),
    make("subtract_numbers", "number_math", "II->I", "the difference `{a} - {b}`",
         "return {a} - {b}", lambda k, a, b: a - b),
    make("larger_number", "number_math", "II->I", "the larger of `{a}` and `{b}`",
         "return max({a}, {b})", lambda k, a, b: max(a, b)),
    make("multiply_numbers", "number_math", "II->I", "the product `{a} * {b}`",
         "return {a} * {b}", lambda k, a, b: a * b),
)
