"""When ``memory.recall = "auto"`` searches memory: a cheap rules classifier.

Automatic recall costs a search (and tokens) per turn, and injecting memories into a
message that does not need them distracts the model. These rules decide, in microseconds
and without a model, whether a message refers to something memory may hold. A message
triggers recall when any rule matches (case-insensitive unless said otherwise):

``past``
    Talk about earlier exchanges: "last time", "remember", "remind me", "earlier",
    "previously", "before", "again", "as usual", "ago", "back then", "the other day",
    "we decided / agreed / discussed / talked about / said", "you said / told me /
    mentioned / suggested / promised", "I told you / said / mentioned".
``past_question``
    Questions about the past or about facts once stated: "what did I/we/you", "what was",
    "what's my", "did I/we/you", "have I/we", "when did", "where did", "who was",
    "how did", "which one did", "what is my", and any wh-question with a past auxiliary
    ("what area was hit by the flood", "how many times did …").
``date``
    Dates and times in the past or named: "yesterday", "last week/month/year/night/
    weekend/<weekday>", "this morning", weekday and month names, ISO dates
    (2024-05-01), numeric dates (5/1, 01.05.2024), "on the 3rd".
``relation``
    "my <relation>": family, partner, friends, colleagues, pets, doctor, landlord...
``file``
    "the file / doc / document / note(s) / draft / repo / script / spreadsheet /
    config / report / list / plan", shared media and events ("the photo / video /
    link / email / workshop / meeting / trip / upcoming <thing>"), and tokens that look
    like file names or paths (``notes.md``, ``src/app.py``, ``~/todo``).
``preference``
    "prefer", "preference", "favourite/favorite", "my usual", "do I like", "allergic",
    "I can't stand", "I hate", "I love".
``decision``
    "decided", "decision", "agreed", "settled on", "we chose", "the plan", "deadline",
    "committed to".
``name``
    A capitalised word that does not start a sentence and is not a common capitalised
    word (pronoun "I", greetings, weekdays handled above): probably a person, a place or
    a project memory may know ("ask Priya", "the Falcon rollout"). Case-sensitive.

What does not trigger: greetings, thanks, small talk, general questions ("how do
magnets work?"), arithmetic. A false positive costs one search; a false negative is
what ``"always"`` is for. English only, as the default templates are.
"""

from __future__ import annotations

import re
from collections.abc import Callable

RULE_PAST = "past"
RULE_PAST_QUESTION = "past_question"
RULE_DATE = "date"
RULE_RELATION = "relation"
RULE_FILE = "file"
RULE_PREFERENCE = "preference"
RULE_DECISION = "decision"
RULE_NAME = "name"

_WEEKDAYS = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_MONTHS = (
    r"january|february|march|april|june|july|august|september|october|november|december"
    r"|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_RELATIONS = (
    r"wife|husband|partner|spouse|girlfriend|boyfriend|fianc[eé]e?|mom|mum|mother|dad|father"
    r"|parents?|son|daughter|kids?|children|child|baby|brother|sister|siblings?|cousin"
    r"|aunt|uncle|grandma|grandmother|grandpa|grandfather|grandparents?|niece|nephew"
    r"|in-laws?|family|friends?|best friend|roommate|flatmate|neighbou?r|boss|manager"
    r"|colleagues?|co-?workers?|team|teammates?|client|customer|landlord|doctor|dentist"
    r"|therapist|teacher|coach|dog|cat|pets?|puppy|kitten"
)
_FILE_EXTENSIONS = (
    r"md|txt|py|js|ts|tsx|json|toml|ya?ml|csv|xlsx?|docx?|pdf|pptx?|html?|css|sh|sql"
    r"|ini|cfg|conf|log|ipynb|rs|go|java|rb|c|h|cpp|png|jpe?g|svg|zip"
)

_I = re.IGNORECASE
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        RULE_PAST,
        re.compile(
            r"\b(last time|remember|remind me|recall|earlier|previously|before|again"
            r"|as usual|ago|back then|the other day|so far"
            r"|we (?:decided|agreed|discussed|talked|said|spoke|planned|chose)"
            r"|you (?:said|told|mentioned|suggested|promised|recommended|wrote|noted)"
            r"|i (?:told|said|mentioned|asked|wrote|shared|gave) (?:you|that|it|earlier|before))\b",
            _I,
        ),
    ),
    (
        RULE_PAST_QUESTION,
        re.compile(
            r"\b(what (?:did|was|were|had) (?:i|we|you|my|our|the)"
            r"|what(?:'s| is| are) (?:my|our)"
            r"|(?:did|have|had) (?:i|we|you)\b"
            r"|(?:when|where|how|why|who) (?:did|was|were|had)"
            r"|which (?:one|ones) did"
            # A question with a past auxiliary anywhere: "what area was hit by a flood".
            r"|(?:what|which|who|whom|whose|where|when|how|why)\b[^.?!]{0,80}?"
            r"\b(?:was|were|did|had|used to)\b)",
            _I,
        ),
    ),
    (
        RULE_DATE,
        re.compile(
            rf"\b(yesterday|tonight|this morning|last (?:week|month|year|night|weekend"
            rf"|{_WEEKDAYS})|next (?:week|month|year|{_WEEKDAYS})|{_WEEKDAYS}|{_MONTHS}"
            r"|on the \d{1,2}(?:st|nd|rd|th))\b"
            r"|\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}[./]\d{1,2}(?:[./]\d{2,4})?\b",
            _I,
        ),
    ),
    (RULE_RELATION, re.compile(rf"\b(?:my|our) (?:{_RELATIONS})\b", _I)),
    (
        RULE_FILE,
        re.compile(
            r"\bthe (?:file|files|doc|docs|document|documents|notes?|draft|repo|repository"
            r"|script|spreadsheet|sheet|config|report|list|plan|project|slides|memo"
            # Shared media and events: "the photo", "the workshop", "the upcoming trip".
            r"|photos?|pictures?|pics?|images?|videos?|recordings?|links?|articles?|emails?"
            r"|messages?|books?|posts?|meeting|workshop|event|trip|party|conference|class"
            r"|course|show|concert|game|interview|appointment|upcoming \w+)\b"
            rf"|(?<![\w@])[\w~-]+(?:/[\w.-]+)*\.(?:{_FILE_EXTENSIONS})\b"
            r"|(?<![\w:/])(?:~|\.{1,2})?/[\w.-]+/[\w./-]+",
            _I,
        ),
    ),
    (
        RULE_PREFERENCE,
        re.compile(
            r"\b(prefer|prefers|preferred|preference|preferences|favou?rite|my usual"
            r"|do i (?:like|love|hate|want)|allergic|i can't stand|i cannot stand"
            r"|i hate|i love|i like)\b",
            _I,
        ),
    ),
    (
        RULE_DECISION,
        re.compile(
            r"\b(decided|decision|decisions|agreed|settled on|we chose|the plan"
            r"|deadline|deadlines|committed to|promised)\b",
            _I,
        ),
    ),
)

# Capitalised words that say nothing about a person, place or project.
_COMMON_CAPITALISED = frozenset(
    {
        "I", "I'm", "I've", "I'd", "I'll", "OK", "Ok", "Okay", "Hi", "Hello", "Hey",
        "Thanks", "Thank", "Please", "Yes", "No", "Sure", "Mr", "Mrs", "Ms", "Dr",
        "English", "God", "AI", "Bot",
    }
)  # fmt: skip
_CAPITALISED = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*(?:'[a-z]+)?\b")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;\n\"“(]\s*)$")


def _has_name(text: str) -> bool:
    for match in _CAPITALISED.finditer(text):
        word = match.group(0)
        if word in _COMMON_CAPITALISED or word.split("'")[0] in _COMMON_CAPITALISED:
            continue
        # A sentence's first word is capitalised anyway: it says nothing.
        if _SENTENCE_START.search(text[: match.start()]):
            continue
        return True
    return False


def _matcher(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: pattern.search(text) is not None


Rule = tuple[str, Callable[[str], bool]]

# In order: the first match names the reason recorded with the recall.
RULES: tuple[Rule, ...] = (
    *((name, _matcher(pattern)) for name, pattern in _PATTERNS),
    (RULE_NAME, _has_name),
)


def recall_reason(text: str) -> str | None:
    """The name of the first rule ``text`` matches (None: no reason to recall)."""
    for name, matches in RULES:
        if matches(text):
            return name
    return None


def wants_recall(text: str) -> bool:
    """Does ``text`` refer to something long-term memory may hold?"""
    return recall_reason(text) is not None
