"""Prompts a Python user sends, for distilling the demo target from a teacher (issue 31), and the held-out
function requests that measure it.

Kinds: function requests built from the standard library's functions and methods (name, signature and
docstring -> "Write a Python function NAME(ARGS) that ..."), a share of everyday utility requests (SIMPLE),
explanations and fixes of short stdlib functions, and general questions. Seeded: the same seed and Python version give the same prompts.
HELDOUT holds 20 function requests with tiny tests; their names never appear in generated prompts, and
``evaluate`` counts the replies that define the requested function and pass its tests."""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

SEED = 31
KIND_WEIGHTS = {"function": 0.45, "simple": 0.12, "explain": 0.14, "fix": 0.14, "general": 0.15}


@dataclass(frozen=True)
class Heldout:
    name: str
    args: str
    does: str
    tests: str  # asserts run after the reply's code

    @property
    def prompt(self) -> str:
        return f"Write a Python function {self.name}({self.args}) that {self.does}."


HELDOUT = [
    Heldout("is_palindrome", "s", "returns True if the string s reads the same forwards and backwards",
            "assert is_palindrome('racecar')\nassert not is_palindrome('hello')\nassert is_palindrome('a')"),
    Heldout("reverse_words", "sentence", "returns the sentence with the order of its words reversed",
            "assert reverse_words('hello big world') == 'world big hello'\nassert reverse_words('one') == 'one'"),
    Heldout("count_vowels", "s", "returns the number of vowels (a, e, i, o, u) in the lowercase string s",
            "assert count_vowels('hello world') == 3\nassert count_vowels('xyz') == 0"),
    Heldout("factorial", "n", "returns the factorial of the non-negative integer n",
            "assert factorial(5) == 120\nassert factorial(0) == 1\nassert factorial(1) == 1"),
    Heldout("fibonacci", "n", "returns the n-th Fibonacci number, with fibonacci(0) == 0 and fibonacci(1) == 1",
            "assert fibonacci(0) == 0\nassert fibonacci(1) == 1\nassert fibonacci(10) == 55"),
    Heldout("is_prime", "n", "returns True if the integer n is a prime number",
            "assert is_prime(7)\nassert is_prime(2)\nassert not is_prime(9)\nassert not is_prime(1)"),
    Heldout("flatten", "nested", "takes a list of lists and returns one list with all their items in order",
            "assert flatten([[1, 2], [3], []]) == [1, 2, 3]\nassert flatten([]) == []"),
    Heldout("largest", "numbers", "returns the largest number in the non-empty list numbers",
            "assert largest([3, 9, 2]) == 9\nassert largest([-5, -2]) == -2"),
    Heldout("celsius_to_fahrenheit", "celsius", "converts a temperature in degrees Celsius to degrees Fahrenheit",
            "assert celsius_to_fahrenheit(0) == 32\nassert celsius_to_fahrenheit(100) == 212"),
    Heldout("word_count", "text", "returns a dictionary mapping each whitespace-separated word in text to its count",
            "assert word_count('a b a') == {'a': 2, 'b': 1}\nassert word_count('') == {}"),
    Heldout("remove_duplicates", "items", "returns a list of the items without duplicates, keeping the first occurrence order",
            "assert remove_duplicates([1, 2, 1, 3, 2]) == [1, 2, 3]\nassert remove_duplicates([]) == []"),
    Heldout("sum_of_digits", "n", "returns the sum of the decimal digits of the non-negative integer n",
            "assert sum_of_digits(1234) == 10\nassert sum_of_digits(0) == 0"),
    Heldout("is_anagram", "a, b", "returns True if the strings a and b are anagrams of each other",
            "assert is_anagram('listen', 'silent')\nassert not is_anagram('abc', 'abd')"),
    Heldout("greatest_common_divisor", "a, b", "returns the greatest common divisor of the positive integers a and b",
            "assert greatest_common_divisor(12, 18) == 6\nassert greatest_common_divisor(7, 5) == 1"),
    Heldout("capitalize_words", "s", "returns s with the first letter of every word in upper case",
            "assert capitalize_words('hello world') == 'Hello World'"),
    Heldout("average", "numbers", "returns the arithmetic mean of the non-empty list numbers",
            "assert average([1, 2, 3, 4]) == 2.5\nassert average([5]) == 5"),
    Heldout("count_occurrences", "items, value", "returns how many times value occurs in the list items",
            "assert count_occurrences([1, 2, 1, 1], 1) == 3\nassert count_occurrences([], 1) == 0"),
    Heldout("to_binary", "n", "returns the binary representation of the non-negative integer n as a string without a prefix",
            "assert to_binary(5) == '101'\nassert to_binary(0) == '0'\nassert to_binary(8) == '1000'"),
    Heldout("merge_dicts", "a, b", "returns a new dictionary with the items of a and b, b's values winning on shared keys",
            "assert merge_dicts({'x': 1}, {'x': 2, 'y': 3}) == {'x': 2, 'y': 3}\nassert merge_dicts({}, {}) == {}"),
    Heldout("chunk_list", "items, size", "splits the list items into consecutive chunks of length size (the last may be shorter)",
            "assert chunk_list([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]\nassert chunk_list([], 3) == []"),
]
HELDOUT_NAMES = frozenset(h.name for h in HELDOUT)


def new_tasks(tasks: list[tuple[str, str, str]], taken: set[str]) -> list[tuple[str, str, str]]:
    """(name, args, what it does) tasks less any whose name holds a held-out request's name or is in taken."""
    return [t for t in tasks if t[0] not in taken and not any(h in t[0] for h in HELDOUT_NAMES)]


def fenced(code: str) -> str:
    """code as the Markdown Python block a prompt quotes it in."""
    return f"```python\n{code}\n```"


def keep_new(items: list[dict], source: str) -> list[dict]:
    """items less any repeated prompt or one holding a held-out name, each given its source and id (as PromptGen
    gives them)."""
    out, ids = [], set()
    for p in items:
        pid = prompt_id(p["user"])
        if pid in ids or any(h in p["user"] for h in HELDOUT_NAMES):
            continue
        ids.add(pid)
        out.append({**p, "source": source, "id": pid})
    return out


def function_requests(tasks, rng: random.Random, second: float) -> list[dict]:
    """Each (name, args, what it does) in the held-out requests' phrasing (FUNCTION_TEMPLATES[0]), a seeded `second`
    share of them in another too (the other FUNCTION_TEMPLATES or EXTRA_TEMPLATES): function prompt dicts. Draws
    from rng once per task, and once more per second phrasing."""
    others = FUNCTION_TEMPLATES[1:] + EXTRA_TEMPLATES
    out = []
    for name, args, does in tasks:
        out.append({"kind": "function", "user": request_text(FUNCTION_TEMPLATES[0], name, args, does), "name": name})
        if rng.random() < second:
            out.append({"kind": "function", "user": request_text(rng.choice(others), name, args, does), "name": name})
    return out


# ----------------------------------------------------------------------------- replies: code blocks

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
PY_LANGS = {"", "python", "py", "python3"}


def code_blocks(reply: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block; an unclosed last fence runs to the end of the reply."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(reply)]


def python_code(reply: str) -> str:
    """The reply's Python: its Python-fenced blocks joined, or the whole reply when it has no fence at all."""
    blocks = code_blocks(reply)
    if not blocks:
        return reply
    return "\n\n".join(c for lang, c in blocks if lang in PY_LANGS)


def parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError):
        return False


def defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree))


def has_def_line(text: str, name: str) -> bool:
    """A `def NAME(` line anywhere in the reply, parsed or not (the looser count that issue 31's teacher
    figure used; `defines` needs the code to parse)."""
    return re.search(rf"^\s*(async\s+)?def\s+{re.escape(name)}\s*\(", text, re.M) is not None


def run_tests(code: str, tests: str, timeout: float = 5.0) -> bool:
    """Runs the reply's code then the asserts in a fresh interpreter (isolated, no site dir, timed out)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "reply_test.py"
        path.write_text(code + "\n\n" + tests + "\n")
        try:
            r = subprocess.run([sys.executable, "-I", "-S", str(path)], cwd=d, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def evaluate(replies: list[str], items: list[Heldout] = HELDOUT, timeout: float = 5.0) -> dict:
    """Counts over replies[i] to items[i].prompt: defines (the reply's Python parses and defines the function),
    passes (and its tests pass), fenced (Markdown code fences), def_line (a `def NAME(` line, parsed or not)."""
    rows = []
    for h, reply in zip(items, replies, strict=True):
        code = python_code(reply)
        fenced = bool(code_blocks(reply))
        ok_def = defines(code, h.name)
        ok_test = ok_def and run_tests(code, h.tests, timeout)
        rows.append({"name": h.name, "fenced": fenced, "defines": ok_def, "passes": ok_test,
                     "def_line": has_def_line(reply, h.name)})
    return {"n": len(rows), **{k: sum(r[k] for r in rows) for k in ("defines", "passes", "fenced", "def_line")},
            "rows": rows}


# ----------------------------------------------------------------------------- answer filter

def check_answer(kind: str, answer: str, finished: bool, name: str | None = None) -> str:
    """'ok' or why a teacher answer is dropped: truncated, no_code (function/fix answers need a fenced block),
    syntax (a Python block does not parse), wrong_name (a function answer does not define the function)."""
    if not finished:
        return "truncated"
    blocks = code_blocks(answer)
    py = [c for lang, c in blocks if lang in PY_LANGS]
    if kind in ("function", "fix") and not py:
        return "no_code"
    if not all(parses(c) for c in py):
        return "syntax"
    if kind == "function" and name and not defines("\n\n".join(py), name):
        return "wrong_name"
    return "ok"


# ----------------------------------------------------------------------------- stdlib functions

@dataclass(frozen=True)
class Func:
    module: str
    name: str
    args: str
    doc: str
    source: str
    method: bool = False


def _module_name(rel: str) -> str:
    mod = rel[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


_SKIP_DIRS = ("test/", "tests/", "idlelib/", "lib2to3/", "turtledemo/", "ensurepip/", "tkinter/", "pydoc_data/")


def _funcs_of(source: str, module: str) -> list[Func]:
    tree = ast.parse(source)
    out = []
    nodes = [(n, False) for n in tree.body] + [(m, True) for c in tree.body if isinstance(c, ast.ClassDef)
                                                 and not c.name.startswith("_") for m in c.body]
    for node, method in nodes:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.name in HELDOUT_NAMES:
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 15 or doc.lower().startswith(("deprecated", "internal", "helper", "undocumented")):
            continue
        if method:
            if any(isinstance(d, ast.Name) and d.id in ("property", "staticmethod") for d in node.decorator_list):
                continue
            # A method becomes a plain function request: self/cls dropped.
            a = node.args
            # A method needs an argument besides self to make sense as a standalone function request.
            if len(a.args) < 2 or a.args[0].arg not in ("self", "cls"):
                continue
            a = ast.arguments(posonlyargs=[], args=a.args[1:], vararg=a.vararg, kwonlyargs=a.kwonlyargs,
                              kw_defaults=a.kw_defaults, kwarg=a.kwarg,
                              defaults=a.defaults[-len(a.args[1:]):] if a.args[1:] and a.defaults else [])
        else:
            a = node.args
        try:
            args = ast.unparse(a)
        except Exception:
            continue
        out.append(Func(module, node.name, args, doc.strip(), ast.get_source_segment(source, node) or "", method))
    return out


def stdlib_functions(limit_files: int | None = None) -> list[Func]:
    """Public functions and methods (self dropped) of this interpreter's standard library with a docstring."""
    out = []
    for module, source in stdlib_modules(limit_files):
        try:
            out.extend(_funcs_of(source, module))
        except (SyntaxError, ValueError):
            continue
    return out


def stdlib_modules(limit_files: int | None = None) -> list[tuple[str, str]]:
    """(module name, source) of this interpreter's standard library files, less tests, demos and private packages."""
    from .data import stdlib_files

    root, files = stdlib_files(limit_files)
    out = []
    for rel in files:
        if rel.startswith(_SKIP_DIRS) or "/test" in rel or any(p.startswith("_") for p in rel.split("/")):
            continue
        try:
            out.append((_module_name(rel), (root / rel).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return out


_IRREGULAR = {"do": "does", "be": "is", "have": "has", "go": "goes"}


def third_person(verb: str) -> str:
    v = verb.lower()
    if v in _IRREGULAR:
        return _IRREGULAR[v]
    if v.endswith(("s", "sh", "ch", "x", "z", "o")):
        return v + "es"
    if v.endswith("y") and len(v) > 1 and v[-2] not in "aeiou":
        return v[:-1] + "ies"
    return v + "s"


def first_sentence(doc: str) -> str:
    para = doc.split("\n\n")[0]
    text = " ".join(para.split())
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".")


_VERB = re.compile(r"^[A-Z][a-z]+$")


def describe(doc: str) -> str | None:
    """'Return the X of Y.' -> 'returns the X of Y'; None when the first sentence does not start with an
    imperative verb (then the prompt quotes the docstring instead)."""
    s = first_sentence(doc)
    words = s.split(" ", 1)
    if len(words) < 2 or not _VERB.match(words[0]) or words[0].endswith(("s", "ed", "ing", "ly")) \
            or words[0] in {"This", "The", "A", "An", "If", "When", "Given", "Like", "Same", "Internal", "Helper",
                            "Deprecated", "Note", "For", "In", "On", "Use"}:
        return None
    if len(s) > 200:
        return None
    return third_person(words[0]) + " " + words[1]


def _short_source(f: Func, max_lines: int = 25) -> str | None:
    src = textwrap.dedent(f.source)
    n = src.count("\n") + 1
    return src if 3 <= n <= max_lines and len(src) < 1200 else None


def without_docstring(src: str) -> str:
    tree = ast.parse(src)
    fn = tree.body[0]
    if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant) \
            and isinstance(fn.body[0].value.value, str) and len(fn.body) > 1:
        fn.body = fn.body[1:]
    return ast.unparse(tree)


class _Bug(ast.NodeTransformer):
    """One seeded mutation: a comparison or arithmetic operator swapped, or an off-by-one constant."""

    SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
             ast.In: ast.NotIn, ast.NotIn: ast.In}

    def __init__(self, target: int):
        self.target, self.seen, self.done = target, 0, False

    def _hit(self) -> bool:
        hit = self.seen == self.target
        self.seen += 1
        return hit

    def visit_Compare(self, node):
        self.generic_visit(node)
        if type(node.ops[0]) in self.SWAPS and self._hit():
            node.ops[0] = self.SWAPS[type(node.ops[0])]()
            self.done = True
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if type(node.op) in self.SWAPS and self._hit():
            node.op = self.SWAPS[type(node.op)]()
            self.done = True
        return node


def buggy(src: str, rng: random.Random) -> str | None:
    """The function with one operator flipped (None when it has no operator to flip)."""
    tree = ast.parse(src)
    counter = _Bug(-1)
    counter.visit(tree)
    if counter.seen == 0:
        return None
    bug = _Bug(rng.randrange(counter.seen))
    tree = bug.visit(ast.parse(src))
    return ast.unparse(tree) if bug.done else None


# Everyday utility requests, the held-out set's kind (none of its names or tasks): the stdlib's own functions
# are often too specialised for a 135M teacher to answer well.
SIMPLE = [
    ("sum_even", "numbers", "returns the sum of the even numbers in the list numbers"),
    ("count_words", "text", "returns the number of words in the string text"),
    ("is_even", "n", "returns True if the integer n is even"),
    ("square_all", "numbers", "returns a list with the square of each number in numbers"),
    ("smallest", "numbers", "returns the smallest number in the non-empty list numbers"),
    ("string_length", "s", "returns the number of characters in the string s"),
    ("first_char", "s", "returns the first character of the non-empty string s"),
    ("last_item", "items", "returns the last item of the non-empty list items"),
    ("repeat_string", "s, n", "returns the string s repeated n times"),
    ("kilometers_to_miles", "km", "converts a distance in kilometers to miles"),
    ("fahrenheit_to_celsius", "fahrenheit", "converts a temperature in degrees Fahrenheit to degrees Celsius"),
    ("area_of_circle", "radius", "returns the area of a circle with the given radius"),
    ("area_of_rectangle", "width, height", "returns the area of a rectangle"),
    ("is_leap_year", "year", "returns True if year is a leap year in the Gregorian calendar"),
    ("count_char", "s, ch", "returns how many times the character ch occurs in the string s"),
    ("reverse_list", "items", "returns a new list with the items in reverse order"),
    ("sort_descending", "numbers", "returns the numbers sorted from largest to smallest"),
    ("unique_count", "items", "returns the number of distinct items in the list items"),
    ("product", "numbers", "returns the product of all numbers in the list numbers"),
    ("power_of_two", "n", "returns True if the positive integer n is a power of two"),
    ("digits_of", "n", "returns the list of decimal digits of the non-negative integer n"),
    ("is_sorted", "items", "returns True if the list items is sorted in ascending order"),
    ("runner_up", "numbers", "returns the second biggest distinct number in numbers"),
    ("common_items", "a, b", "returns a list of the items that appear in both lists a and b"),
    ("starts_with_vowel", "word", "returns True if the string word starts with a vowel"),
    ("title_case", "s", "returns s with the first letter of each word upper case and the rest lower case"),
    ("remove_spaces", "s", "returns the string s without any space characters"),
    ("count_upper", "s", "returns the number of upper-case letters in the string s"),
    ("longest_word", "sentence", "returns the longest word in the sentence"),
    ("shortest_word", "sentence", "returns the shortest word in the sentence"),
    ("join_words", "words", "joins the list of strings words with single spaces"),
    ("split_lines", "text", "returns the list of non-empty lines in text"),
    ("dict_from_lists", "keys, values", "returns a dictionary that maps each key to the value at the same position"),
    ("invert_dict", "d", "returns a new dictionary with the keys and values of d swapped"),
    ("max_key", "d", "returns the key of the dictionary d with the largest value"),
    ("filter_positive", "numbers", "returns a list of the positive numbers in numbers"),
    ("clip", "x, low, high", "returns x limited to the range from low to high"),
    ("running_total", "numbers", "returns the list of cumulative sums of numbers"),
    ("pairwise_sums", "a, b", "returns a list with the sums of the items of a and b at the same positions"),
    ("is_subset", "a, b", "returns True if every item of the list a is also in the list b"),
    ("rotate_left", "items, k", "returns the list items rotated left by k positions"),
    ("nth_square", "n", "returns the square of the integer n"),
    ("cube", "x", "returns x raised to the third power"),
    ("mean_length", "words", "returns the mean length of the strings in the non-empty list words"),
    ("contains_digit", "s", "returns True if the string s contains at least one digit"),
    ("count_lines", "path", "returns the number of lines in the text file at path"),
    ("read_text", "path", "returns the whole content of the text file at path as a string"),
    ("write_lines", "path, lines", "writes each string in lines to the file at path, one per line"),
    ("hex_to_int", "s", "converts a hexadecimal string such as 'ff' to an integer"),
    ("percent", "part, whole", "returns part as a percentage of whole"),
    ("seconds_to_minutes", "seconds", "converts a number of seconds to a string like '2m 5s'"),
    ("initials", "name", "returns the upper-case initials of the words in name"),
    ("min_max", "numbers", "returns a tuple with the smallest and the largest number in numbers"),
    ("pad_left", "s, width", "returns s padded on the left with spaces to the given width"),
    ("safe_divide", "a, b", "returns a divided by b, or None when b is zero"),
    ("zip_to_dict", "pairs", "turns a list of (key, value) pairs into a dictionary"),
    ("index_of", "items, value", "returns the index of the first occurrence of value in items, or -1"),
    ("is_empty", "items", "returns True if the list items has no items"),
    ("odd_numbers", "n", "returns a list of the odd numbers from 1 up to n"),
    ("letter_frequency", "text", "returns a dictionary mapping each letter in text to how often it occurs"),
]

FUNCTION_TEMPLATES = [
    "Write a Python function {head} that {does}.",
    "Write a function {head} in Python that {does}.",
    "Implement a Python function {head} that {does}.",
    "Can you write a Python function {head} that {does}?",
    "I need a Python function {head} that {does}.",
]

# A function request's other phrasings besides FUNCTION_TEMPLATES (the later prompt sets use both)
EXTRA_TEMPLATES = [
    "Please write a Python function {head} that {does}.",
    "Write a Python function {head} that {does}. Keep it short.",
    "Write a Python function {head} that {does}, and show one example call.",
    "Create a Python function called {head} that {does}.",
    "How would you write a Python function {head} that {does}?",
    "Write a Python function {head} that {does}. Include a docstring.",
]


def request_text(template: str, name: str, args: str, does: str) -> str:
    """A function request: `template` (one of FUNCTION_TEMPLATES or EXTRA_TEMPLATES) filled with the
    signature name(args) and what the function does."""
    return template.format(head=f"{name}({args})", does=does)


GENERAL = [
    "What is the capital of {country}?",
    "Explain what {concept} is in Python, with a short example.",
    "What is the difference between a {a} and a {b} in Python?",
    "How do I {task} in Python?",
    "Give me one tip for writing clean Python code about {topic}.",
    "What does the Python built-in {builtin}() do?",
    "Summarise in two sentences what the Python module {module} is for.",
    "Explain {concept} to a beginner.",
    "What does the error {error} mean in Python, and how do I fix it?",
    "Tell me a fun fact about {animal}.",
    "Write a short poem about {thing}.",
    "How do you say 'good morning' in {language}?",
    "Give me three ideas for {activity}.",
]
_FILL = {
    "country": ["France", "Japan", "Italy", "Canada", "Brazil", "Kenya", "Norway", "India", "Egypt", "Peru",
                "Germany", "Spain", "Australia", "Mexico", "Poland", "Vietnam"],
    "concept": ["a list comprehension", "a generator", "a decorator", "a context manager", "a lambda",
                "a dictionary", "a tuple", "a set", "a class", "a module", "an exception", "an iterator",
                "an f-string", "a dataclass", "a slice"],
    "pair": [("list", "tuple"), ("set", "list"), ("function", "method"), ("module", "package"),
             ("generator", "list"), ("shallow copy", "deep copy"), ("class attribute", "instance attribute")],
    "task": ["read a file line by line", "sort a list of dictionaries by a key", "reverse a string",
             "merge two lists", "count the words in a text", "parse a JSON string", "get the current date",
             "remove whitespace from a string", "check if a key is in a dictionary", "write a CSV file",
             "make an HTTP request with the standard library", "measure how long some code takes",
             "create a virtual environment", "handle an exception", "join a list of strings"],
    "topic": ["naming", "functions", "error handling", "comments", "loops", "imports", "testing"],
    "error": ["NameError", "TypeError", "IndexError", "KeyError", "ValueError", "AttributeError",
              "ZeroDivisionError", "ImportError", "IndentationError", "SyntaxError", "RecursionError",
              "FileNotFoundError"],
    "animal": ["octopuses", "cats", "dogs", "elephants", "owls", "bees", "penguins", "dolphins", "ants",
               "giraffes", "snails", "crows", "sharks", "bats", "koalas"],
    "thing": ["the sea", "autumn", "a cup of coffee", "the moon", "a rainy day", "a cat", "programming",
              "a mountain", "the city at night", "friendship", "a bug in my code", "spring"],
    "language": ["French", "Spanish", "German", "Italian", "Japanese", "Portuguese", "Dutch", "Swedish"],
    "activity": ["a weekend trip", "a birthday party", "learning to cook", "a Python side project",
                 "staying focused while studying", "a rainy afternoon", "a team meeting", "exercising at home"],
    "builtin": ["enumerate", "zip", "map", "filter", "sorted", "isinstance", "range", "len", "any", "all",
                "sum", "reversed", "getattr", "repr"],
}


class PromptGen:
    """Seeded prompt generator: ``sample(n)`` -> list of {id, kind, user, name?} dicts. Ids are stable
    (a hash of the prompt text), so a resumed run recognises prompts it already answered."""

    def __init__(self, seed: int = SEED, weights: dict | None = None, funcs: list[Func] | None = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.weights = dict(weights or KIND_WEIGHTS)
        self.funcs = funcs if funcs is not None else stdlib_functions()
        self.funcs = [f for f in self.funcs if f.name not in HELDOUT_NAMES]
        self.short = [f for f in self.funcs if _short_source(f) and not any(n in f.source for n in HELDOUT_NAMES)]
        self.modules = sorted({f.module.split(".")[0] for f in self.funcs})

    def function(self) -> dict:
        r = self.rng
        f = r.choice(self.funcs)
        d = describe(f.doc)
        if d is not None and r.random() < 0.85:
            # Mostly the held-out requests' own phrasing; a few others so the target does not key on it.
            t = r.choices(FUNCTION_TEMPLATES, weights=[6] + [1] * (len(FUNCTION_TEMPLATES) - 1))[0]
            user = request_text(t, f.name, f.args, d)
        else:
            doc = f.doc.split("\n\n")[0].strip()
            user = f"Write a Python function {f.name}({f.args}). Its docstring:\n\n{doc}"
        return {"kind": "function", "user": user, "name": f.name, "source": f"{f.module}.{f.name}"}

    def simple(self) -> dict:
        name, args, does = self.rng.choice(SIMPLE)
        t = self.rng.choices(FUNCTION_TEMPLATES, weights=[6] + [1] * (len(FUNCTION_TEMPLATES) - 1))[0]
        return {"kind": "function", "user": request_text(t, name, args, does), "name": name,
                "source": "simple"}

    def explain(self) -> dict:
        f = self.rng.choice(self.short)
        code = without_docstring(textwrap.dedent(f.source))
        ask = self.rng.choice(["Explain what this Python function does:", "What does this code do?",
                               "Can you explain this function step by step?"])
        return {"kind": "explain", "user": f"{ask}\n\n{fenced(code)}", "source": f"{f.module}.{f.name}"}

    def fix(self) -> dict:
        r = self.rng
        for _ in range(20):
            f = r.choice(self.short)
            bad = buggy(without_docstring(textwrap.dedent(f.source)), r)
            if bad is None:
                continue
            s = first_sentence(f.doc)
            intent = f"It should: {s}. " if describe(f.doc) else ""
            user = f"This Python function has a bug. {intent}Find and fix it:\n\n{fenced(bad)}"
            return {"kind": "fix", "user": user, "name": f.name, "source": f"{f.module}.{f.name}"}
        return self.function()

    def general(self) -> dict:
        r = self.rng
        t = r.choice(GENERAL)
        if "{a}" in t:
            a, b = r.choice(_FILL["pair"])
            user = t.format(a=a, b=b)
        elif "{module}" in t:
            user = t.format(module=r.choice(self.modules))
        else:
            key = re.search(r"\{(\w+)\}", t).group(1)
            user = t.format(**{key: r.choice(_FILL[key])})
        # A few openings multiply the small space of general questions (~275) without changing what is asked.
        lead = r.choices(["", "Quick question: ", "Please answer briefly. ", "Hi! ", "I'm learning. "],
                         weights=[4, 1, 1, 1, 1])[0]
        return {"kind": "general", "user": lead + user}

    def sample(self, n: int, exclude: set | None = None) -> list[dict]:
        """n distinct prompts (ids not in exclude) in the kinds' proportions; a kind whose prompts are (nearly)
        all drawn drops out, so fewer than n only when every kind has run dry."""
        kinds = dict(self.weights)
        seen = set(exclude or ())
        out = []
        while len(out) < n and kinds:
            kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
            for _ in range(200):
                p = getattr(self, kind)()
                p["id"] = prompt_id(p["user"])
                if p["id"] not in seen and not any(h in p["user"] for h in HELDOUT_NAMES):
                    break
            else:
                del kinds[kind]
                continue
            seen.add(p["id"])
            out.append(p)
        return out


def prompt_id(user: str) -> str:
    return hashlib.sha256(user.encode()).hexdigest()[:16]


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Print generated prompts (JSON lines) or the held-out requests.")
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--heldout", action="store_true")
    a = ap.parse_args(argv)
    items = [{"name": h.name, "user": h.prompt} for h in HELDOUT] if a.heldout else PromptGen(a.seed).sample(a.n)
    for p in items:
        print(json.dumps(p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
