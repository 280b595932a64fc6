"""The `agent` task: multi-turn tool use against a small per-problem shop database.

The prompt asks a question ("How much for 3 pen and 2 cup?") whose facts live in a
hidden database of items with a price and a stock count. The policy calls tools as
`<call>TOOL ARGS</call>`; the environment appends `<obs>TEXT</obs>`:

    price ITEM   -> the item's price          stock ITEM -> how many are in stock
    calc EXPR    -> the value of an arithmetic expression (code_lang's expressions)

Anything else gets `<obs>error: ...</obs>`. The answer ends with `#### N`. `score`
replays the transcript: every observation must be exactly what the environment returns
for the transcript up to its call (a forged observation scores 0), then the final answer
must be right (1.0) or the score is 0.0. At most MAX_CALLS calls.

Demonstrations vary the order of lookups, optional notes between calls, whether the
arithmetic is done with `calc` or written out (one line or step by step), operand order,
and the closing line.

Length distribution: questions about several items ("cost", "stock") ask about a
long-tailed number of them (base.long_tail_count): mostly one or two, a few up to
MAX_ITEMS, each a lookup call, so transcripts have a long tail (at most ~320 characters).

Difficulty 1 (the default): 1-6 items, P(n) proportional to 0.5 ** (n - 1); 2: 2-6, 0.6;
3: 2-6, 0.65, bigger numbers. The shop holds DB_SIZE items, so some are never asked about.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from bebop.tasks.base import (
    DEFAULT_DIFFICULTY,
    MAX_COMPLETION_CHARS,
    Problem,
    check_difficulty,
    draw_split,
    final_answer,
    load_truth,
    long_tail_count,
    spaced,
)
from bebop.tasks.code_lang import CodeError, evaluate_expression

CALL, END_CALL, OBS, END_OBS = "<call>", "</call>", "<obs>", "</obs>"
MAX_CALLS = 8
MAX_CALL_CHARS = 100
ITEMS = ("pen", "cup", "hat", "map", "box", "key", "jar", "bag", "mug", "toy")
KINDS = ("cost", "worth", "stock", "left")
NOTES = ("", "", "", "Look up.\n", "Need facts.\n")

DB_SIZE = 8
MAX_ITEMS = 6  # the most items a question names: their lookups and a calc stay < MAX_CALLS


@dataclass(frozen=True)
class Level:
    min_items: int  # items a "cost" or "stock" question names: min_items..max_items,
    max_items: int  # long-tailed: P(n) proportional to ratio ** (n - min_items)
    ratio: float
    max_price: int
    max_stock: int


LEVELS = {1: Level(1, MAX_ITEMS, 0.5, 9, 9), 2: Level(2, MAX_ITEMS, 0.6, 9, 12),
          3: Level(2, MAX_ITEMS, 0.65, 12, 20)}


@dataclass(frozen=True)
class Question:
    kind: str  # cost: sum qty*price | worth: stock*price | stock: sum stock | left: stock-qty
    items: tuple[str, ...]
    qtys: tuple[int, ...]  # per item for "cost"; one number for "left"; empty otherwise


def _draw_db(rng: random.Random, difficulty: int) -> dict[str, list[int]]:
    level = LEVELS[difficulty]
    names = rng.sample(ITEMS, DB_SIZE)
    return {name: [rng.randint(1, level.max_price), rng.randint(2, level.max_stock)]
            for name in names}


def _draw_question(rng: random.Random, db: dict[str, list[int]], difficulty: int) -> Question:
    level = LEVELS[difficulty]
    kind = rng.choice(KINDS)
    if kind in ("worth", "left"):
        item = rng.choice(sorted(db))
        qtys: tuple[int, ...] = (rng.randint(1, db[item][1]),) if kind == "left" else ()
        return Question(kind, (item,), qtys)
    lo = max(level.min_items, 2) if kind == "stock" else level.min_items  # one stock: no sum
    items = tuple(rng.sample(sorted(db), long_tail_count(rng, lo, level.max_items, level.ratio)))
    qtys = tuple(rng.randint(1, 5) for _ in items) if kind == "cost" else ()
    return Question(kind, items, qtys)


def _listing(parts: list[str]) -> str:
    """'pen', 'pen and cup', 'pen, cup and hat'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + f" and {parts[-1]}"


def _prompt(q: Question) -> str:
    listing = _listing(list(q.items))
    if q.kind == "cost":
        listing = _listing([f"{n} {item}" for n, item in zip(q.qtys, q.items)])
        return f"How much for {listing}?\n"
    if q.kind == "worth":
        return f"What is the stock of {q.items[0]} worth?\n"
    if q.kind == "stock":
        return f"How many {listing} in stock in all?\n"
    return f"How many {q.items[0]} are left after selling {q.qtys[0]}?\n"


def _lookups(q: Question) -> list[tuple[str, str]]:
    tools = {"cost": ("price",), "worth": ("price", "stock"), "stock": ("stock",),
             "left": ("stock",)}[q.kind]
    return [(tool, item) for item in q.items for tool in tools]


def _terms(q: Question, db: dict[str, list[int]]) -> tuple[list[list[int]], str]:
    """The answer as a list of products joined by '+' or '-' (operands in prompt order)."""
    if q.kind == "cost":
        return [[n, db[item][0]] for n, item in zip(q.qtys, q.items)], "+"
    if q.kind == "worth":
        return [[db[q.items[0]][1], db[q.items[0]][0]]], "+"
    if q.kind == "stock":
        return [[db[item][1]] for item in q.items], "+"
    return [[db[q.items[0]][1]], [q.qtys[0]]], "-"


def _answer(terms: list[list[int]], joiner: str) -> int:
    values = [factors[0] * (factors[1] if len(factors) > 1 else 1) for factors in terms]
    return values[0] + sum(v if joiner == "+" else -v for v in values[1:])


def _facts(problem: Problem) -> tuple[dict[str, list[int]], Question]:
    data = load_truth(problem, ("db", "question", "answer"))
    q = data["question"]
    return data["db"], Question(q["kind"], tuple(q["items"]), tuple(q["qtys"]))


def _tool(db: dict[str, list[int]], call: str) -> str:
    """The observation text for one call's contents, e.g. 'price pen' -> '4'."""
    tool, _, arg = call.strip().partition(" ")
    arg = arg.strip()
    if tool in ("price", "stock"):
        if arg not in db:
            return f"error: no item {arg[:20]}"
        return str(db[arg][0 if tool == "price" else 1])
    if tool == "calc":
        try:
            return str(evaluate_expression(arg))
        except CodeError as exc:
            return f"error: {str(exc)[:60]}"
    return "error: tools are price, stock, calc"


def environment_reply(db: dict[str, list[int]], transcript: str) -> str:
    """The `<obs>..</obs>` the environment appends after the transcript's last call."""
    start = transcript.rfind(CALL)
    if not transcript.endswith(END_CALL) or start < 0:
        return f"{OBS}error: no call{END_OBS}"
    if transcript.count(END_CALL) > MAX_CALLS:
        return f"{OBS}error: too many calls{END_OBS}"
    call = transcript[start + len(CALL):-len(END_CALL)]
    if len(call) > MAX_CALL_CHARS:
        return f"{OBS}error: bad call{END_OBS}"
    return f"{OBS}{_tool(db, call)}{END_OBS}"


def _replay(db: dict[str, list[int]], completion: str) -> str | None:
    """The text after the last observation, or None if any observation is not genuine."""
    pos, calls = 0, 0
    while (end := completion.find(END_CALL, pos)) >= 0:
        end += len(END_CALL)
        calls += 1
        if calls > MAX_CALLS or OBS in completion[pos:end] or END_OBS in completion[pos:end]:
            return None
        reply = environment_reply(db, completion[:end])
        if not completion.startswith(reply, end):
            return None
        pos = end + len(reply)
    tail = completion[pos:]
    return None if any(tag in tail for tag in (CALL, OBS, END_OBS)) else tail


def _expression(terms: list[list[int]], joiner: str, rng: random.Random, op) -> str:
    """The answer's arithmetic with factors and (for sums) terms in a random order."""
    products = [op("*").join(map(str, rng.sample(f, len(f)))) for f in terms]
    if joiner == "+":
        rng.shuffle(products)
    return op(joiner).join(products)


def _worked(terms: list[list[int]], joiner: str, answer: int, rng: random.Random, op,
            db: dict[str, list[int]]) -> str:
    """The arithmetic part of a demonstration: via calc, one line, or step by step."""
    if len(terms) == 1 and len(terms[0]) == 1:  # the answer is a looked-up fact
        return ""
    style = rng.choice(("calc", "calc", "line", "steps"))
    expr = _expression(terms, joiner, rng, op)
    if style == "calc":
        call = f"calc {expr}"
        return f"{CALL}{call}{END_CALL}{OBS}{_tool(db, call)}{END_OBS}\n"
    if style == "steps" and len(terms) > 1 and any(len(f) > 1 for f in terms):
        values = [f[0] * f[1] if len(f) > 1 else f[0] for f in terms]
        lines = [f"{op('*').join(map(str, f))}{op('=')}{v}" for f, v in zip(terms, values)
                 if len(f) > 1]
        lines.append(f"{op(joiner).join(map(str, values))}{op('=')}{answer}")
        return "\n".join(lines) + "\n"
    return f"{expr}{op('=')}{answer}\n"


class AgentTask:
    name = "agent"

    def __init__(self, difficulty: int = DEFAULT_DIFFICULTY) -> None:
        self.difficulty = check_difficulty(difficulty)

    def _draw(self, rng: random.Random) -> tuple[str, Problem]:
        db = _draw_db(rng, self.difficulty)
        q = _draw_question(rng, db, self.difficulty)
        terms, joiner = _terms(q, db)
        truth = json.dumps({"db": db, "question": {"kind": q.kind, "items": q.items,
                                                   "qtys": q.qtys},
                            "answer": _answer(terms, joiner)}, separators=(",", ":"))
        return truth, Problem(_prompt(q), truth, self.name)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return draw_split(self.name, self._draw, split, n, seed)

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        db, q = _facts(problem)
        op = spaced(rng)
        calls = _lookups(q)
        rng.shuffle(calls)
        text = rng.choice(NOTES)
        for tool, item in calls:
            text += f"{CALL}{tool} {item}{END_CALL}{OBS}{_tool(db, f'{tool} {item}')}{END_OBS}"
            text += rng.choice(("", "", "\n"))
        terms, joiner = _terms(q, db)
        answer = _answer(terms, joiner)
        text += _worked(terms, joiner, answer, rng, op, db)
        return text + rng.choice(("", "", f"So {answer}.\n")) + f"#### {answer}"

    def score(self, problem: Problem, completion: str) -> float:
        if len(completion) > MAX_COMPLETION_CHARS:
            return 0.0
        db, _ = _facts(problem)
        tail = _replay(db, completion)
        if tail is None:
            return 0.0
        return 1.0 if final_answer(tail) == load_truth(problem, ("answer",))["answer"] else 0.0

    def observe(self, problem: Problem, transcript: str) -> str | None:
        return environment_reply(_facts(problem)[0], transcript)
