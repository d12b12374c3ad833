"""A seeded, templated prompt set for training drafts: chat, code, maths, writing,
explanations, rewriting, role-play and multi-turn conversations.

Every prompt is built here from small word lists and templates (no benchmark data): the
draft only needs prompts that make the target talk the way it will talk for users.
"""

from __future__ import annotations

import random
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
         "making friends", "writing clearly", "learning to code", "running a marathon"]


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


@dataclass(frozen=True)
class Category:
    name: str
    weight: float
    make: Callable[[random.Random], Messages]


CATEGORIES = (
    Category("chat", 0.14, chat), Category("explain", 0.12, explain),
    Category("writing", 0.12, writing), Category("roleplay", 0.05, roleplay),
    Category("rewrite", 0.07, rewrite), Category("code", 0.22, code),
    Category("maths", 0.20, maths), Category("multi_turn", 0.08, multi_turn),
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
