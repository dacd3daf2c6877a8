"""Parse and count tweets with Spark built-ins only: no Python UDFs, so the work stays in
the JVM and every row costs no serialisation round trip.

The record rule (the parse bolt's contract): a record is a tweet when its line is
exactly one JSON value (RFC 8259: no NaN, no duplicate keys, no lone surrogate escapes,
nothing after the value but whitespace) that is an object whose ``id`` is an integer
that fits in 64 bits (not a boolean, not ``1.0``) and whose ``text`` is a string.
Anything else is a dead letter with the first reason that applies, in this order:
``invalid UTF-8``, ``not valid JSON``, ``not a JSON object``, ``id missing or not an
integer``, ``text missing or not a string``.

The counting rule: ``text`` is split on ASCII whitespace only (space, ``\\t``,
``\\n``, ``\\r``, ``\\x0b``, ``\\x0c``; a no-break space is part of a token); a token
of at least two characters starting with ``#`` is a hashtag, with ``@`` a user; tokens
are kept verbatim (case and punctuation included); each distinct token counts once per
tweet, and each distinct (user, hashtag) pair of a tweet counts once.

The record ledger (``transactional.ledger``): every bolt here accounts for each record
it is given, so the runner checks before each commit that none was lost or counted
twice. The parse bolt carries each record's id into its tweet or its dead letter; the
count bolt sends each tweet to its three streams, each a route of its own: a tweet is
folded into the counts through its first hashtag (user, pair), and one without any into
a group of its own, which is dropped (``drop_where``), with that reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F

from transactional import checkpoint
from transactional.bolt import DEFAULT_STREAM, Bolt
from transactional.errors import ContractError
from transactional.ledger import COLUMNS, ID, drop_where, explode, folded
from transactional.spark import Prebuilt
from transactional.types import TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "DEAD_LETTERS",
    "HASHTAGS",
    "TWEET_IDS",
    "USERS",
    "USERS_HASHTAGS",
    "CountIds",
    "CountTags",
    "ParseTweets",
]

DEAD_LETTERS = "dead_letters"
HASHTAGS = "hashtags"
USERS = "users"
USERS_HASHTAGS = "users_hashtags"
TWEET_IDS = "tweet_ids"

#: The spout columns the parse bolt reads (``transactional.sources.text.RECORD_SCHEMA``) and their types.
RECORD_COLUMNS = {"raw": "string", "error": "string"}

#: ASCII whitespace, as the inside of a Java regex character class. Python's str.split()
#: would also split on Unicode spaces, which is not the rule.
WHITESPACE = r" \t\n\r\x0B\f"


def _in_array(raw: Column) -> Column:
    """``raw`` parsed inside ``[...]`` (see ``_parse``), in a projection of its own: its
    result is used twice, and a projection keeps it once per row (Spark does not merge
    a projection into the next when that would compute a costly expression twice)."""
    return F.try_parse_json(F.concat(F.lit("["), raw, F.lit("]")))


def _parse(raw: Column, in_array: Column) -> Column:
    """The JSON value of ``raw`` as a VARIANT, given ``_in_array(raw)``; null unless
    ``raw`` is exactly one value.

    ``try_parse_json(raw)`` alone accepts trailing data (``{"id": 1} junk`` parses as the
    object): the parser stops where the root value closes. So the line is parsed inside
    ``[...]``, and taken when that array has exactly one element (no ``$[1]``: a JSON
    null there is a VARIANT null, not SQL NULL) and its root closed at the closing
    bracket added around the line. It did when ``raw`` holds no ``]`` at all. Otherwise
    (a line with a ``]``, in a string or not) the line is parsed again inside
    ``{"_": ...}``: trailing data that survives one wrapper cannot survive both, since
    after the value the array needs ``,`` or ``]`` and the object ``,`` or ``}``, and
    after a shared ``,`` the array needs a value followed by ``,`` or ``]``, the object
    a key followed by ``:``. (Parsing every line twice cost a fifth of the parse.) A
    line of JSON ``null`` gives a VARIANT null, not SQL NULL.
    """
    in_object = F.try_parse_json(F.concat(F.lit('{"_":'), raw, F.lit("}")))
    # And and Or evaluate their right side only when needed: the second parse runs only
    # for a line with a ``]``.
    single = F.variant_get(in_array, "$[1]", "variant").isNull()
    closed = ~raw.contains("]") | in_object.isNotNull()
    return F.when(single & closed, F.variant_get(in_array, "$[0]", "variant"))


def _reason(error: Column, value: Column) -> Column:
    # A VARIANT casts to a struct only from an object (a JSON null gives NULL); with no
    # field asked for, the cast reads none, where ``schema_of_variant(value)`` would
    # describe the whole value (a sixth of the parse bolt's work: analysis.md,
    # fourteenth round).
    is_object = F.try_variant_get(value, "$", "struct<>").isNotNull()
    # Integers of any width report BIGINT; an integer beyond 64 bits is a DECIMAL. A
    # missing field gives NULL, which ``eqNullSafe`` compares as false.
    id_type = F.schema_of_variant(F.variant_get(value, "$.id", "variant"))
    text_type = F.schema_of_variant(F.variant_get(value, "$.text", "variant"))
    return (
        F.when(error.isNotNull(), error)
        .when(value.isNull(), F.lit("not valid JSON"))
        .when(~is_object, F.lit("not a JSON object"))
        .when(~id_type.eqNullSafe("BIGINT"), F.lit("id missing or not an integer"))
        .when(~text_type.eqNullSafe("STRING"), F.lit("text missing or not a string"))
    )


@dataclass(frozen=True)
class _ParseColumns:
    wrapped: list[Column]
    parsed: list[Column]
    checked: list[Column]
    rows: list[Column]
    is_tweet: Column
    tweets: list[Column]
    is_dead: Column
    dead_letters: list[Column]


def _parse_columns() -> _ParseColumns:
    value, reason = F.col("value"), F.col("reason")
    valid = reason.isNull()
    raw, error, record = F.col("raw"), F.col("error"), F.col(ID)
    return _ParseColumns(
        wrapped=[raw, error, record, _in_array(raw).alias("in_array")],
        parsed=[raw, error, record, _parse(raw, F.col("in_array")).alias("value")],
        # The one-row ``inline`` is an optimisation barrier: a filter on a plain projected
        # ``reason`` would be pushed below the projection with the parse inlined into
        # every branch of its CASE, parsing each line several times (5x slower).
        checked=[
            F.col("raw"),
            record,
            F.inline(F.array(F.struct(value, _reason(F.col("error"), value).alias("reason")))),
        ],
        rows=[
            F.when(valid, F.variant_get(value, "$.id", "bigint")).alias("id"),
            F.when(valid, F.variant_get(value, "$.text", "string")).alias("text"),
            F.when(~valid, F.col("raw")).alias("raw"),
            reason,
            record,
        ],
        is_tweet=valid,
        tweets=[F.col("id"), F.col("text"), record],
        is_dead=reason.isNotNull(),
        dead_letters=[F.col("raw"), reason, record],
    )


class ParseTweets(Bolt):
    """Spout records ``(raw, error)`` -> tweets ``(id LONG, text STRING)`` on the default
    stream and ``(raw STRING, reason STRING)`` on ``dead_letters``: a bad line never
    stops the topology and is never dropped, it is committed with the batch. Each record
    goes on in exactly one of the two, with its ledger id."""

    outputs = (DEFAULT_STREAM, DEAD_LETTERS)
    accounts = True
    _columns = Prebuilt(_parse_columns)

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> Mapping[str, DataFrame]:
        _check_records(batch)
        c = self._columns(batch)
        # Both streams (and every stream counted from the tweets) read these rows: keep
        # them once, on first use, instead of parsing every line again per consumer.
        rows = checkpoint(
            batch.select(*c.wrapped).select(*c.parsed).select(*c.checked).select(*c.rows)
        )
        tweets = rows.where(c.is_tweet).select(*c.tweets)
        dead = rows.where(c.is_dead).select(*c.dead_letters)
        return {DEFAULT_STREAM: tweets, DEAD_LETTERS: dead}


def _check_records(batch: DataFrame) -> None:
    """A spout of the wrong shape is a wiring mistake: say so at the first batch, by
    name, rather than fail every attempt deep inside Spark's analyser."""
    have = {name: kind for name, kind in batch.dtypes if name not in COLUMNS}  # the spout's
    if any(have.get(name) != kind for name, kind in RECORD_COLUMNS.items()):
        expected = ", ".join(f"{n} {k.upper()}" for n, k in RECORD_COLUMNS.items())
        got = ", ".join(f"{n} {k.upper()}" for n, k in have.items()) or "no columns"
        raise ContractError(
            f"ParseTweets reads the spout's columns {expected} "
            f"(transactional.sources.text.RECORD_SCHEMA), but the batch has {got}: make the "
            "spout emit that schema"
        )


def _tokens(prefix: str) -> Column:
    """The distinct tokens of ``text`` that start with ``prefix`` and have at least one
    more character. One regex scan finds them: ``prefix`` where no non-whitespace
    character precedes it (a token's start), then the rest of the token; each match is
    a whole token, as a split on whitespace would give it. (Splitting into every token
    and filtering them cost half as much again: analysis.md, fourteenth round.)"""
    token = rf"(?<![^{WHITESPACE}]){re.escape(prefix)}[^{WHITESPACE}]+"
    return F.array_distinct(F.regexp_extract_all(F.col("text"), F.lit(token), 0))


@dataclass(frozen=True)
class _CountColumns:
    tags: list[Column]
    hashtags: Column
    users: Column
    paired: list[Column]
    user_and_hashtags: list[Column]
    users_hashtags: list[Column]
    count: list[Column]


def _count_columns() -> _CountColumns:
    pairs = (F.size("hashtags") > 0) & (F.size("users") > 0)
    return _CountColumns(
        tags=[_tokens("#").alias("hashtags"), _tokens("@").alias("users"), F.col(ID)],
        # Each tweet's id stays on its first hashtag (user, pair) only: counted once. A
        # tweet with none keeps one row, a null key, that carries it into a group of its
        # own, which finish_batch drops (the ledger counts it in the same pass).
        hashtags=explode("hashtags", "hashtag", outer=True),
        users=explode("users", "user", outer=True),
        paired=[
            F.when(pairs, F.col("users")).alias("users"),
            F.when(pairs, F.col("hashtags")).alias("hashtags"),
            F.col(ID),
        ],
        user_and_hashtags=[explode("users", "user", outer=True), F.col("hashtags")],
        users_hashtags=[F.col("user"), explode("hashtags", "hashtag", outer=True)],
        count=[F.count(F.lit(1)).cast("long").alias("count"), *folded()],
    )


class CountIds(Bolt):
    """Tweets -> ``(id, count)``, one row per tweet with count 1 (the committer sums them
    per id): with ``--record-ids``, every tweet is counted under its own id, so that a
    checker can name each tweet lost (0) or counted twice (2), not only a total off."""

    accounts = True

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        return batch.select("id", F.lit(1).cast("long").alias("count"), ID)


class CountTags(Bolt):
    """Tweets -> ``hashtags(hashtag, count)``, ``users(user, count)`` and
    ``users_hashtags(user, hashtag, count)`` for the batch, counts as LONG.

    ``process`` emits one row per distinct token (or pair) per tweet; ``finish_batch``
    aggregates over the whole batch, as Storm's batch bolts do. Each stream is one pass
    over the parsed tweets.

    Every tweet goes to each of the three streams (a route each, for the ledger): folded
    into the counts of its first token (or pair), or, when it has none there, into a
    null key's group, which ``finish_batch`` drops (``drop_where``) with that reason.
    """

    outputs = (HASHTAGS, USERS, USERS_HASHTAGS)
    accounts = True
    routes = ((HASHTAGS,), (USERS,), (USERS_HASHTAGS,))
    _columns = Prebuilt(_count_columns)

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> Mapping[str, DataFrame]:
        c = self._columns(batch)
        # Tokenised once, on first use, for the three streams.
        tags = checkpoint(batch.select(*c.tags))
        return {
            HASHTAGS: tags.select(c.hashtags),
            USERS: tags.select(c.users),
            USERS_HASHTAGS: tags.select(*c.paired)
            .select(*c.user_and_hashtags)
            .select(*c.users_hashtags),
        }

    def finish_batch(
        self, attempt: TransactionAttempt, outputs: Mapping[str, DataFrame]
    ) -> Mapping[str, DataFrame]:
        count = self._columns(outputs[HASHTAGS]).count
        hashtags = outputs[HASHTAGS].groupBy("hashtag").agg(*count)
        users = outputs[USERS].groupBy("user").agg(*count)
        pairs = outputs[USERS_HASHTAGS].groupBy("user", "hashtag").agg(*count)
        return {
            HASHTAGS: drop_where(hashtags, F.col("hashtag").isNull(), "no hashtag"),
            USERS: drop_where(users, F.col("user").isNull(), "no user"),
            USERS_HASHTAGS: drop_where(pairs, F.col("user").isNull(), "no user and hashtag pair"),
        }
