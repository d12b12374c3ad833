"""A seeded, templated prompt set for training drafts: chat, code, maths, writing,
explanations, rewriting, role-play, reasoning, extraction, how-to advice, multi-step word
problems, science questions and multi-turn conversations.

Every prompt is built here from small word lists and templates, plus real functions of the
Python standard library (their names, signatures, docstrings and source) for code prompts
with the variety real code has. No benchmark data: the draft only needs prompts that make
the target talk the way it will talk for users.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
import re
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass

Messages = list[dict]

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "machine learning", "inflation",
    "the French Revolution", "climate change", "vaccines", "the internet", "blockchain",
    "plate tectonics", "the immune system", "renewable energy", "the stock market",
    "quantum computing", "the Roman Empire", "DNA", "electric cars", "sleep", "meditation",
    "volcanoes", "the printing press", "supply and demand", "neural networks", "gravity",
    "the moon landing", "honey bees", "coral reefs", "the human heart", "compound interest",
    "recycling", "the Renaissance", "earthquakes", "antibiotics", "cloud computing",
    "the Great Wall of China", "solar panels", "time zones", "rainbows", "bread baking",
    "coffee", "chess", "the Olympic Games", "public libraries", "remote work", "urban gardening",
    "ocean tides", "the seasons", "magnets", "batteries", "social media", "video games",
    "classical music", "jazz", "the Amazon rainforest", "deserts", "penguins", "dinosaurs",
    "the periodic table", "democracy", "taxes", "credit scores", "healthy eating", "exercise",
    "learning a language", "public speaking", "time management", "encryption", "open source",
    "databases", "operating systems", "the speed of light", "evolution", "nutrition labels",
    "the Industrial Revolution", "ancient Egypt", "the Cold War", "the Silk Road", "Shakespeare",
    "impressionist painting", "the Olympic torch", "human rights", "the scientific method",
    "philosophy of mind", "stoicism", "utilitarianism", "the Big Bang", "exoplanets",
    "the Mars rovers", "nuclear fusion", "semiconductors", "3D printing", "CRISPR",
    "the placebo effect", "memory and learning", "habits", "procrastination", "happiness",
    "minimalism", "fast fashion", "urbanization", "public transport", "bicycles", "airplanes",
    "the Panama Canal", "bridges", "skyscrapers", "wind turbines", "hydropower", "wildfires",
    "hurricanes", "glaciers", "rivers", "soil", "composting", "beekeeping", "fermentation",
    "cheese making", "tea", "chocolate", "spices", "vegetarian diets", "food safety",
    "first aid", "the common cold", "allergies", "vitamins", "mental health", "friendship",
    "parenting", "job interviews", "negotiation", "leadership", "teamwork", "startups",
    "marketing", "budgeting", "retirement savings", "insurance", "cryptocurrency",
    "artificial intelligence", "large language models", "cybersecurity", "passwords",
    "web browsers", "smartphones", "the GPS system", "robotics", "self-driving cars",
    "data privacy", "version control", "unit testing", "recursion", "sorting algorithms",
    "hash tables", "graph theory", "prime numbers", "probability", "statistics", "calculus",
    "geometry", "fractions", "the Pythagorean theorem", "origami", "photography", "film making",
    "poetry", "mythology", "folk tales", "board games", "football", "tennis", "yoga",
    "mountain climbing", "camping", "astronomy for beginners", "bird watching", "gardening",
]
AUDIENCES = ["a five-year-old", "a high school student", "a beginner", "a busy manager",
             "a curious adult", "a college student", "my grandmother", "a new employee"]
FORMS = ["short poem", "haiku", "short story", "blog post", "persuasive essay", "limerick",
         "product description", "formal email", "thank-you note", "speech", "news article",
         "diary entry", "song chorus", "movie pitch", "restaurant review", "cover letter"]
TONES = ["formal", "casual", "humorous", "enthusiastic", "polite", "concise", "friendly"]
NAMES = ["Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jack",
         "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
ITEMS = ["apples", "pencils", "stickers", "books", "cookies", "marbles", "stamps", "cards",
         "eggs", "flowers", "toy cars", "cupcakes", "shells", "coins", "oranges", "bottles"]
ROLES = ["a tour guide in Paris", "a pirate captain", "a personal trainer", "a chef",
         "a detective", "a museum curator", "a travel agent", "a librarian", "a space explorer",
         "a job interviewer", "a science teacher", "a customer support agent"]
PLACES = ["Japan", "Italy", "Peru", "Canada", "Egypt", "Norway", "Kenya", "Vietnam",
          "Portugal", "Mexico", "New Zealand", "Iceland"]

# (function name, arguments, what it does) -> code prompts in several styles
CODE_TASKS = [
    ("reverse_words", "s: str", "reverses the order of the words in a sentence"),
    ("is_palindrome", "s: str", "checks whether a string is a palindrome, ignoring case"),
    ("count_vowels", "s: str", "counts the vowels in a string"),
    ("fibonacci", "n: int", "returns the first n Fibonacci numbers as a list"),
    ("is_prime", "n: int", "returns True if n is a prime number"),
    ("flatten", "items: list", "flattens a nested list of lists into one list"),
    ("merge_sorted", "a: list, b: list", "merges two sorted lists into one sorted list"),
    ("word_count", "text: str", "returns a dict mapping each word to its count"),
    ("gcd", "a: int, b: int", "returns the greatest common divisor of two integers"),
    ("second_largest", "nums: list", "returns the second largest distinct number in a list"),
    ("remove_duplicates", "items: list", "removes duplicates while keeping the order"),
    ("celsius_to_fahrenheit", "c: float", "converts a temperature from Celsius to Fahrenheit"),
    ("chunk", "items: list, size: int", "splits a list into chunks of the given size"),
    ("binary_search", "nums: list, target: int", "returns the index of target or -1"),
    ("capitalize_words", "s: str", "capitalizes the first letter of every word"),
    ("sum_of_digits", "n: int", "returns the sum of the digits of a non-negative integer"),
    ("running_average", "nums: list", "returns the running average after each element"),
    ("rotate_list", "items: list, k: int", "rotates a list to the right by k steps"),
    ("is_anagram", "a: str, b: str", "checks whether two strings are anagrams"),
    ("matrix_transpose", "m: list", "transposes a matrix given as a list of rows"),
    ("factorial", "n: int", "returns n factorial"),
    ("count_words_longer_than", "text: str, n: int", "counts words longer than n letters"),
    ("max_subarray_sum", "nums: list", "returns the largest sum of a contiguous subarray"),
    ("valid_parentheses", "s: str", "checks whether brackets in a string are balanced"),
    ("to_binary", "n: int", "returns the binary representation of n as a string"),
    ("pairwise_sums", "nums: list, target: int", "returns all pairs that add up to target"),
    ("caesar_cipher", "text: str, shift: int", "encrypts text with a Caesar cipher"),
    ("median", "nums: list", "returns the median of a list of numbers"),
    ("find_missing", "nums: list", "finds the missing number in a list of 1..n"),
    ("longest_word", "text: str", "returns the longest word in a sentence"),
]
CODE_EXTRAS = ["", "", "", " Use a loop.", " Add type hints.", " Handle edge cases.",
               " Keep it short.", " Add comments.", " Avoid built-in helpers."]
LANGS = ["Python", "Python", "Python", "JavaScript", "Java", "C++", "Go", "Rust"]


GOALS = ["saving money", "studying", "sleeping better", "staying focused", "cooking at home",
         "making friends", "writing clearly", "learning to code", "running a marathon",
         "eating healthier", "reducing stress", "reading more books", "keeping a journal",
         "working from home", "managing a small team", "moving to a new city"]
TASKS = ["change a flat tire", "make a budget spreadsheet", "prepare for a job interview",
         "write a good resume", "start a vegetable garden", "train a puppy", "bake sourdough bread",
         "set up a home network", "learn to play guitar", "plan a birthday party",
         "organize a small closet", "improve my handwriting", "back up my photos",
         "negotiate a salary", "choose a laptop", "write a research paper", "make cold brew coffee",
         "clean a cast iron pan", "start running", "give constructive feedback",
         "write a SQL query that joins two tables", "debug a Python program", "use git branches",
         "read a nutrition label", "save for a house", "learn a new language quickly"]


def _pick(rng: random.Random, items: list) -> str:
    return items[rng.randrange(len(items))]


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def chat(rng: random.Random) -> Messages:
    t, u = _pick(rng, TOPICS), _pick(rng, TOPICS)
    return _user(_pick(rng, [
        f"What is {t}?", f"Can you tell me about {t}?", f"What are the pros and cons of {t}?",
        f"Give me {rng.randint(3, 7)} interesting facts about {t}.",
        f"How are {t} and {u} related?", f"What should everyone know about {t}?",
        f"I'm planning a trip to {_pick(rng, PLACES)}. What should I pack?",
        f"Give me {rng.randint(3, 8)} tips for {_pick(rng, GOALS)}.",
        f"What are some good hobbies for someone interested in {t}?",
        f"Recommend {rng.randint(2, 5)} books about {t} and say why.",
    ]))


def explain(rng: random.Random) -> Messages:
    t = _pick(rng, TOPICS)
    return _user(_pick(rng, [
        f"Explain {t} to {_pick(rng, AUDIENCES)}.", f"How does {t} work?",
        f"Explain {t} in simple terms.", f"Why is {t} important?",
        f"Describe the history of {t} in a few paragraphs.",
        f"Explain {t} step by step.", f"What are common misconceptions about {t}?",
        f"Compare {t} and {_pick(rng, TOPICS)} in a short table.",
    ]))


def writing(rng: random.Random) -> Messages:
    form, t = _pick(rng, FORMS), _pick(rng, TOPICS)
    return _user(_pick(rng, [
        f"Write a {form} about {t}.", f"Write a {_pick(rng, TONES)} {form} about {t}.",
        f"Compose a {form} for {_pick(rng, NAMES)}, who loves {t}.",
        f"Write a {form} set in {_pick(rng, PLACES)}.",
        f"Draft a {_pick(rng, TONES)} email to my team about {t}.",
        f"Write a {rng.randint(3, 6)}-paragraph essay on {t}.",
        f"Write a travel blog post about a trip to {_pick(rng, PLACES)}.",
    ]))


def roleplay(rng: random.Random) -> Messages:
    role = _pick(rng, ROLES)
    return _user(_pick(rng, [
        f"Pretend you are {role}. Introduce yourself and describe your day.",
        f"Act as {role} and give me advice about {_pick(rng, TOPICS)}.",
        f"You are {role}. Answer in character: what is the best part of your job?",
        f"Imagine you are {role} meeting {_pick(rng, NAMES)} for the first time. Write the "
        "conversation.",
    ]))


def rewrite(rng: random.Random) -> Messages:
    a, b = _pick(rng, TOPICS), _pick(rng, TOPICS)
    n = _pick(rng, NAMES)
    text = (f"{n} has been reading about {a} for {rng.randint(2, 12)} weeks. They think it is "
            f"closely connected to {b}, and they plan to give a talk about both topics at the "
            f"local library on day {rng.randint(1, 28)} of the month. About "
            f"{rng.randint(10, 90)} people are expected to attend.")
    return _user(_pick(rng, [
        f"Summarize this in one sentence:\n\n{text}",
        f"Rewrite this in a {_pick(rng, TONES)} tone:\n\n{text}",
        f"Extract the names, topics and numbers from this text as JSON:\n\n{text}",
        f"Turn this into a bullet list:\n\n{text}",
        f"Fix any grammar problems and make it clearer:\n\n{text}",
        f"Write three questions a reader might ask about this:\n\n{text}",
    ]))


def code(rng: random.Random) -> Messages:
    name, args, does = CODE_TASKS[rng.randrange(len(CODE_TASKS))]
    lang = _pick(rng, LANGS)
    doc = does[0].upper() + does[1:] + "."
    stub = f'def {name}({args}):\n    """{doc}"""\n'
    extra = _pick(rng, CODE_EXTRAS)
    return _user(_pick(rng, [
        f"Write a {lang} function that {does}.",
        f"Write a {lang} function `{name}` that {does}. Include a short example.",
        f"Complete the following Python function:\n\n```python\n{stub}```",
        f"{stub}",
        f"Implement this function and explain how it works:\n\n```python\n{stub}```",
        f"Write unit tests for a Python function that {does}.",
        f"What is the time complexity of a function that {does}? Show an implementation.",
        f"Write a {lang} program that reads input from the user and "
        f"{does.replace('returns', 'prints')}.",
    ]) + extra)


def maths(rng: random.Random) -> Messages:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    n, m, item = _pick(rng, NAMES), _pick(rng, NAMES), _pick(rng, ITEMS)
    price = rng.choice([0.5, 1.25, 2, 3, 4.5, 5, 7, 12])
    problems = [
        f"{n} has {a} {item}. {m} gives {n} {b} more, and then {n} gives away {c}. How many "
        f"{item} does {n} have now?",
        f"{n} buys {c} packs of {item}. Each pack has {b} {item} and costs ${price}. How many "
        f"{item} did {n} get and how much did they spend?",
        f"A store sells {item} for ${price} each. {n} has ${a * 2}. How many {item} can {n} "
        "buy, and how much money is left?",
        f"{n} reads {b} pages a day. The book has {a * 10} pages. How many days will it take "
        "to finish the book?",
        f"A train travels at {a + 30} km/h for {c} hours and then at {b + 20} km/h for "
        f"{rng.randint(1, 5)} hours. How far does it travel in total?",
        f"{n} earns ${a + 10} per hour and works {c} hours a day for {rng.randint(3, 6)} days. "
        f"{n} spends {rng.choice([10, 20, 25, 50])}% of it. How much is saved?",
        f"There are {a + b} students in a class. {a} of them play football and the rest "
        "play chess. What fraction of the class plays chess?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
        f"{n} is {c} years older than {m}. In {b} years the sum of their ages will be "
        f"{2 * (a + b) + c}. How old is {m} now?",
        f"A recipe needs {c} eggs for {b} cookies. How many eggs are needed for {b * a} "
        "cookies?",
        f"What is {a * 7} times {b}?", f"What is {a * b * c} divided by {c}?",
        f"Solve for x: {c}x + {a} = {c * b + a}.",
        f"What is {rng.choice([10, 15, 20, 25, 40])}% of {a * 20}?",
        f"A shirt costs ${a + 20}. It is on sale for {rng.choice([10, 20, 25, 30])}% off. What "
        "is the sale price?",
    ]
    text = _pick(rng, problems)
    suffix = _pick(rng, ["", "", " Explain your reasoning step by step.",
                         " Show your work.", " Think step by step."])
    return _user(text + suffix)


FOLLOW_UPS = [
    "Can you make it shorter?", "Can you give me an example?", "Now explain it differently.",
    "Rewrite your answer as a bullet list.", "What are the main takeaways?",
    "Can you add more detail?", "Now write it for a child.", "Translate that into French.",
    "What would be a good title for this?", "Can you double-check that?",
]


def multi_turn(rng: random.Random) -> Messages:
    first = _pick(rng, [chat, explain, writing, maths, code])(rng)
    reply = _pick(rng, [
        "Sure! Here is a short answer: it depends on the details, but the key idea is simple.",
        "Of course. In short, there are a few important points to keep in mind.",
        "Here is my answer. Let me know if you would like more detail.",
    ])
    return first + [{"role": "assistant", "content": reply},
                    {"role": "user", "content": _pick(rng, FOLLOW_UPS)}]


# Standard-library modules whose public functions and methods become code prompts: pure
# Python, present on every CPython 3.10+, no side effects on import.
STDLIB_MODULES = (
    "string", "textwrap", "statistics", "fractions", "heapq", "bisect", "functools",
    "posixpath", "shutil", "json", "csv", "calendar", "colorsys", "difflib", "fnmatch",
    "glob", "html", "ipaddress", "random", "shlex", "urllib.parse", "base64", "datetime",
    "collections", "copy", "pprint", "email.utils", "mimetypes", "tokenize", "ast",
    "argparse", "logging", "gettext", "locale", "quopri", "uu", "wave", "zipfile",
    "tarfile", "configparser", "enum", "dataclasses", "graphlib", "numbers", "operator",
    "pathlib", "platform", "plistlib", "secrets", "sched", "smtplib", "socketserver",
    "sre_parse", "tempfile", "timeit", "trace", "types", "typing", "uuid", "warnings",
    "weakref", "webbrowser", "xml.dom.minidom", "zipapp", "http.cookies", "http.client",
    "urllib.request", "email.message", "email.header", "imaplib", "ftplib", "pdb", "cmd",
    "code", "codeop", "dis", "pickletools", "queue", "threading", "asyncio.queues",
    "concurrent.futures._base", "contextlib", "filecmp", "fileinput", "netrc", "optparse",
)


@dataclass(frozen=True)
class StdlibFunction:
    name: str  # qualified inside its module: func or Class.method
    signature: str  # "(a, b=1)" without self
    doc: str  # first paragraph of the docstring, one line
    source: str  # the body as written, dedented (empty when not available or too long)


def _first_paragraph(doc: str) -> str:
    text = inspect.cleandoc(doc).split("\n\n")[0]
    return " ".join(text.split())


@functools.lru_cache(maxsize=1)
def stdlib_functions() -> tuple[StdlibFunction, ...]:
    """Public, documented functions and methods of STDLIB_MODULES, sorted by name (the same
    set for the same Python version)."""
    found: dict[str, StdlibFunction] = {}
    for mod_name in STDLIB_MODULES:
        try:
            with warnings.catch_warnings():  # deprecated modules warn on import
                warnings.simplefilter("ignore")
                module = importlib.import_module(mod_name)
        except Exception:  # a module that a Python build lacks (or deprecated away)
            continue
        candidates = []
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                candidates.append((name, obj))
            elif inspect.isclass(obj):
                candidates += [(f"{name}.{m}", f) for m, f in vars(obj).items()
                               if inspect.isfunction(f) and not m.startswith("_")]
        for qual, fn in candidates:
            entry = _describe(qual, fn)
            if entry:
                found[f"{mod_name}.{qual}"] = entry
    return tuple(found[k] for k in sorted(found))


def _describe(qual: str, fn: Callable) -> StdlibFunction | None:
    doc = fn.__doc__ and _first_paragraph(fn.__doc__)
    if not doc or len(doc) < 20 or len(doc) > 400:
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
    signature = str(sig.replace(parameters=params, return_annotation=sig.empty))
    # defaults such as sentinels or functions print as "<... at 0x7f...>": a new address in
    # every process, which would change the prompts a seed draws
    signature = re.sub(r"<[^<>]* at 0x[0-9a-f]+>", "...", signature)
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        source = ""
    if source.count("\n") > 30:
        source = ""
    return StdlibFunction(qual, signature, doc, source)


def stdlib_code(rng: random.Random) -> Messages:
    funcs = stdlib_functions()
    if not funcs:  # a Python without sources: fall back to the templated tasks
        return code(rng)
    fn = funcs[rng.randrange(len(funcs))]
    short = fn.name.split(".")[-1]
    doc = fn.doc[0].lower() + fn.doc[1:]
    wrapped = textwrap.fill(fn.doc, 84, subsequent_indent="    ")
    stub = f'def {short}{fn.signature}:\n    """{wrapped}\n    """\n'
    asks = [
        f"Complete the following Python function.\n\n```python\n{stub}```",
        f"Write a Python function `{short}{fn.signature}`. Its docstring says: {fn.doc}",
        f"Implement `{short}` in {_pick(rng, LANGS)}: {doc}",
        f"{stub}",
        f"Write unit tests for this Python function:\n\n```python\n{stub}```",
    ]
    if fn.source:
        asks += [
            f"Explain what this Python code does:\n\n```python\n{fn.source}```",
            f"Review this Python function and suggest improvements:\n\n```python\n{fn.source}```",
            f"Add comments to this code:\n\n```python\n{fn.source}```",
            f"Rewrite this function in {_pick(rng, LANGS[3:])}:\n\n```python\n{fn.source}```",
        ]
    ask, extra = _pick(rng, asks), _pick(rng, CODE_EXTRAS).strip()
    return _user(f"{ask}\n\n{extra}" if extra and ask.endswith("`") else f"{ask} {extra}".strip())


PUZZLES = [
    "{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest?",
    "If all {x} are {y} and some {y} are {z}, must some {x} be {z}? Explain.",
    "{a} has twice as many {item} as {b}. Together they have {n3} {item}. How many does {a} "
    "have?",
    "A farmer has chickens and cows: {n1} heads and {n2} legs in total. How many of each?",
    "Which is heavier: a kilogram of {item} or a kilogram of feathers? Explain.",
    "{a}, {b} and {c} each own one pet: a cat, a dog and a fish. {a} is allergic to fur and "
    "{b} does not own the dog. Who owns which pet?",
    "What comes next in the sequence {s}? Explain the pattern.",
    "A clock shows {h}:{m:02d}. What is the angle between the hour and minute hands?",
]
WORDS = ["cats", "birds", "robots", "teachers", "musicians", "painters", "doctors", "pilots"]


def reasoning(rng: random.Random) -> Messages:
    a, b, c = rng.sample(NAMES, 3)
    x, y, z = rng.sample(WORDS, 3)
    heads = rng.randint(8, 40)
    cows = rng.randint(1, heads - 1)
    start, step = rng.randint(1, 9), rng.randint(2, 7)
    seq = ", ".join(str(start + step * i * i) for i in range(5))
    text = _pick(rng, PUZZLES).format(
        a=a, b=b, c=c, x=x, y=y, z=z, item=_pick(rng, ITEMS), n3=3 * rng.randint(4, 40),
        n1=heads, n2=2 * heads + 2 * cows, s=seq, h=rng.randint(1, 12), m=rng.randrange(0, 60, 5))
    return _user(text + _pick(rng, ["", "", " Think step by step.", " Be concise."]))


def extraction(rng: random.Random) -> Messages:
    people = rng.sample(NAMES, 3)
    places = rng.sample(PLACES, 3)
    rows = [f"{p} moved to {pl} in {rng.randint(1990, 2024)} to work on {_pick(rng, TOPICS)}."
            for p, pl in zip(people, places)]
    text = " ".join(rows)
    return _user(_pick(rng, [
        f"Extract every person, place and year from this text as a JSON list:\n\n{text}",
        f"Make a markdown table with columns name, place, year and topic:\n\n{text}",
        f"Who moved most recently? Answer from the text only.\n\n{text}",
        f"List the topics mentioned in this text, one per line:\n\n{text}",
    ]))


def howto(rng: random.Random) -> Messages:
    task, goal = _pick(rng, TASKS), _pick(rng, GOALS)
    return _user(_pick(rng, [
        f"How do I {task}?", f"What is the best way to {task}?",
        f"Give me a step-by-step guide to {task}.",
        f"I have never tried to {task}. Where should I start?",
        f"What are common mistakes people make when they {task}?",
        f"My friend wants to {task} but has only {rng.randint(1, 5)} hours. Any advice?",
        f"Make a {rng.randint(2, 8)}-week plan for {goal}.",
        f"I keep failing at {goal}. What am I probably doing wrong?",
        f"Should I focus on {goal} or on {_pick(rng, GOALS)} first? Explain the trade-offs.",
    ]))


def word_problem(rng: random.Random) -> Messages:
    """Multi-step story problems (three or four operations), the kind chat users ask."""
    n, m, item = _pick(rng, NAMES), _pick(rng, NAMES), _pick(rng, ITEMS)
    a, b, c, d = rng.randint(3, 90), rng.randint(2, 30), rng.randint(2, 9), rng.randint(2, 6)
    pct = rng.choice([10, 20, 25, 30, 40, 50, 75])
    problems = [
        f"{n} collects {item}. On Monday {n} has {a}. Each day for {d} days {n} finds {b} more, "
        f"then gives {c} to {m} every day. How many {item} does {n} have at the end?",
        f"A bakery makes {a * 4} {item} a day and sells {pct}% of them in the morning. In the "
        f"afternoon it sells {b} more. How many are left at closing time?",
        f"{n} wants to buy a bike that costs ${a * 10}. {n} has saved ${b * 5} and earns "
        f"${c * 4} a week mowing lawns. How many weeks until {n} can buy the bike?",
        f"A school trip needs {d} buses. Each bus holds {b + 20} students and costs ${a * 5}. "
        f"If {a + 50} students go, how much does each student pay?",
        f"{n} runs {c} km on weekdays and {c * 2} km on Saturdays, and rests on Sundays. How far "
        f"does {n} run in {d} weeks?",
        f"{n} and {m} share {a * 6} {item} so that {n} gets {d} times as many as {m}. "
        f"How many does each get?",
        f"A tank holds {a * 10} liters. It leaks {c} liters an hour while a pump adds {b} "
        f"liters an hour. Starting half full, how long until it is full?",
        f"{n} spent {pct}% of a ${a * 20} budget on food and ${b * 3} on travel. How much "
        "of the budget is left, in dollars and as a percentage?",
    ]
    suffix = _pick(rng, ["", " Show your steps.", " Explain your reasoning.",
                         " Give the final answer on its own line."])
    return _user(_pick(rng, problems) + suffix)


REACTIONS = ["rust", "baking soda and vinegar", "soap", "batteries", "cooking an egg"]


def science(rng: random.Random) -> Messages:
    h, v, t, m = rng.randint(5, 80), rng.randint(2, 40), rng.randint(2, 20), rng.randint(1, 50)
    t1, t2 = rng.sample(TOPICS, 2)
    return _user(_pick(rng, [
        f"A ball is dropped from a height of {h} meters. How long does it take to reach the "
        "ground? Ignore air resistance.",
        f"A car accelerates from rest to {v} m/s in {t} seconds. What is its acceleration and "
        "how far does it travel?",
        f"How much energy is needed to heat {m} kg of water by {t} degrees Celsius?",
        f"What is the difference between {t1} and {t2}?",
        "Why does ice float on water?", "What would happen if the Earth stopped rotating?",
        f"Explain the chemistry behind {_pick(rng, REACTIONS)}.",
        f"A circuit has a {v} volt battery and a {m} ohm resistor. What current flows?",
        f"Describe an experiment a student could do at home to learn about {t1}.",
    ]))


@dataclass(frozen=True)
class Category:
    name: str
    weight: float
    make: Callable[[random.Random], Messages]


CATEGORIES = (
    Category("chat", 0.09, chat), Category("explain", 0.08, explain),
    Category("writing", 0.09, writing), Category("roleplay", 0.04, roleplay),
    Category("rewrite", 0.04, rewrite), Category("code", 0.08, code),
    Category("stdlib_code", 0.14, stdlib_code), Category("maths", 0.10, maths),
    Category("word_problem", 0.10, word_problem), Category("howto", 0.07, howto),
    Category("science", 0.05, science),
    Category("reasoning", 0.05, reasoning), Category("extraction", 0.03, extraction),
    Category("multi_turn", 0.04, multi_turn),
)


def build_prompts(n: int, seed: int = 0) -> list[tuple[str, Messages]]:
    """n distinct (category, messages) prompts, deterministic for a seed."""
    rng = random.Random(seed)
    weights = [c.weight for c in CATEGORIES]
    seen: set[str] = set()
    out: list[tuple[str, Messages]] = []
    for _ in range(n * 50):
        if len(out) >= n:
            break
        cat = rng.choices(CATEGORIES, weights)[0]
        messages = cat.make(rng)
        key = repr(messages)
        if key not in seen:
            seen.add(key)
            out.append((cat.name, messages))
    return out


def describe() -> str:
    """One line for the model card."""
    return ", ".join(f"{c.name} {c.weight:.0%}" for c in CATEGORIES)
