"""Plans built once: an attempt's frames, built over its kept batch, re-pointed at a
later attempt's batch in Spark's JVM instead of built again through py4j, as Structured
Streaming plans one query and re-plans it for each micro-batch (``Bolt.plan_once``;
docs/architecture.md, "Plans built once").

The batch ``SparkEngine.materialise`` returns is a chain of one-child nodes (the
coalesce, maybe a column dropped) over a lazy checkpoint's ``LogicalRDD``. Re-pointing
a frame is one ``transformDown`` of its plan with a map as the rule (a Scala ``Map`` is
a ``PartialFunction``): each relation over the template batch's rows gives way to one of
the same attributes, which every node above refers to, over the later batch's rows; and
each observation in ``observed`` (a ledger's tally) gives way to one named for the
later attempt, so that attempts in flight together never share one. The plan is then
analysed again in the JVM (``Dataset.ofRows``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, Observation, SparkSession

#: The leaf of a batch ``materialise`` returns: the lazy checkpoint's relation.
KEPT_LEAF = "LogicalRDD"
#: A coalesce: a later batch must have the template's partition count.
COALESCE = "Repartition"
#: Where Spark's physical partitionings live.
_PHYSICAL = "org.apache.spark.sql.catalyst.plans.physical"
#: The longest chain of nodes a kept batch stands on, its leaf included.
CHAIN = 4


class Replan:
    """Frames built over one batch, checked once (``of``) to be re-pointable, then
    re-pointed at each later batch of the same schema and shape (``over``)."""

    def __init__(
        self,
        spark: SparkSession,
        chain: list[Any],
        leaves: list[Any],
        observed: Sequence[Any],
    ) -> None:
        self.spark = spark
        self.schema = chain[0].schema()
        self.shape = _shape(chain)
        #: The kept relation's schema, and whether the batch observes it (``Pending``):
        #: a later batch of that schema may then be given as its kept relation alone.
        self.kept_schema = chain[-1].schema()
        self.observes = any(kind == "CollectMetrics" for kind, _ in self.shape)
        jvm: Any = spark._jvm
        self._relation = getattr(jvm, "org.apache.spark.sql.execution.LogicalRDD")
        self._unknown = getattr(jvm, f"{_PHYSICAL}.UnknownPartitioning")
        self._nil = getattr(getattr(jvm, "scala.collection.immutable.Nil$"), "MODULE$")
        self._none = getattr(getattr(jvm, "scala.None$"), "MODULE$")
        self._lock = threading.Lock()
        #: Every relation over the template batch's rows, as the frames hold it: the
        #: analyser gives one side of a union (or a join) of the batch with itself
        #: attributes of its own, so there may be several.
        self.leaves = leaves
        #: The observations to rename: the template's ``CollectMetrics`` nodes.
        self.observed = [frame._jdf.logicalPlan() for frame in observed]
        #: Each observed frame's place in ``observed``, by the frame (which it keeps).
        self._places = {id(frame): place for place, frame in enumerate(observed)}
        self._frames = list(observed)
        self._ids = [int(node.dataframeId()) for node in self.observed]
        #: Every form of each observation the frames hold (the analyser rewrites one
        #: side of a union of frames that share attributes, its observations with it),
        #: with its place in ``observed`` and its fields as ``makeCopy`` takes them
        #: (the first, its name, set anew for each attempt).
        self.variants: list[tuple[int, Any, Any]] = []

    def _find_variants(self, plans: Sequence[Any]) -> None:
        places = {str(node.name()): place for place, node in enumerate(self.observed)}
        found: dict[str, list[Any]] = {}
        for plan in plans:
            for node in _observations_in(plan, places):
                same = found.setdefault(str(node.name()), [])
                if not any(node.equals(other) for other in same):
                    same.append(node)
        self.variants = [
            (places[name], node, self._array(_fields(node)))
            for name, nodes in found.items()
            for node in nodes
        ]

    @classmethod
    def of(
        cls,
        spark: SparkSession,
        frames: Sequence[DataFrame],
        was: DataFrame,
        observed: Sequence[DataFrame] = (),
    ) -> Replan | None:
        """None unless every relation over ``was``'s rows in ``frames`` can be re-pointed:
        not when a frame reads the batch inside a subquery, reads another RDD's relation
        (a checkpoint a bolt made, which would keep the template's rows), still reads the
        batch once re-pointed at a stand-in (an empty batch's RDD), or where this Spark
        builds its relations otherwise. ``observed``: frames whose root is an
        observation (``DataFrame.observe``)."""
        from py4j.protocol import Py4JError

        chain = _chain(was._jdf.logicalPlan())
        if chain is None or not _kept_leaf(chain[-1]):
            return None
        if any(str(f._jdf.logicalPlan().nodeName()) != "CollectMetrics" for f in observed):
            return None
        gone = chain[-1].rdd().id()
        plans = [frame._jdf.logicalPlan() for frame in frames]
        leaves: dict[str, Any] = {}
        for plan in plans:
            if not plan.subqueriesAll().isEmpty():
                return None
            for leaf, rdd in _relations(plan):
                if rdd != gone:  # a checkpoint a bolt made of this batch: it would stay
                    return None
                leaves.setdefault(str(leaf.output().toString()), leaf)
        replan = cls(spark, chain, list(leaves.values()), observed)
        replan._find_variants([*plans, *replan.observed])
        try:
            stand_in = spark.range(0)._jdf.queryExecution().toRdd()
            trial = [f"trial-{uuid.uuid4().hex}" for _ in replan.observed]
            rule = replan._rule(stand_in, trial)
            olds = [str(node.name()) for node in replan.observed]
            for plan in plans:
                tried = plan.transformDown(rule)
                if any(rdd == gone for _, rdd in _relations(tried)):
                    return None
                if _observations_in(tried, olds):  # an observation it did not rename
                    return None
        except Py4JError:
            return None
        return replan

    def over(self, now: DataFrame, kept: bool = False) -> Repointed | None:
        """The frames re-pointed at ``now`` (as each is asked for); None: ``now`` is not
        a batch of the same schema and shape (its coalesce's partition count among it),
        and the attempt builds its plans anew. ``kept``: ``now`` is a kept relation
        alone (``Pending.kept``), to stand where the template's observed, one-task batch
        stood on its own."""
        plan = now._jdf.logicalPlan()
        if kept:
            if not (self.observes and _kept_leaf(plan) and self.kept_schema.equals(plan.schema())):
                return None
            leaf = plan
        else:
            if not self.schema.equals(plan.schema()):
                return None
            chain = _chain(plan)
            if chain is None or _shape(chain) != self.shape or not _kept_leaf(chain[-1]):
                return None
            leaf = chain[-1]
        names = [f"ledger-{uuid.uuid4().hex}" for _ in self.observed]
        observations = {
            place: self._observation(name, dataframe)
            for place, (name, dataframe) in enumerate(zip(names, self._ids, strict=True))
        }
        rule = self._rule(leaf.rdd(), names)
        return Repointed(self.spark, rule, observations, self._places)

    def _rule(self, rdd: Any, names: Sequence[str]) -> Any:
        """The map ``transformDown`` applies: each of ``leaves`` to a relation of the
        same attributes over ``rdd``; each form of each observation to one named as
        ``names`` says (by its place in ``observed``).

        The new relation claims no partitioning, ordering, statistics or constraints:
        the template's describe the template's rows (the coalesce above it sets the
        partitioning the plans use anyway)."""
        jvm: Any = self.spark._jvm
        unknown = self._unknown(rdd.getNumPartitions())
        nil, none, session = self._nil, self._none, self.spark._jsparkSession
        rules = {
            leaf: self._relation(leaf.output(), rdd, unknown, nil, False, none, session, none, none)
            for leaf in self.leaves
        }
        for place, node, fields in self.variants:
            with self._lock:  # the fields are shared by the attempts in flight
                fields[0] = names[place]  # CollectMetrics' first field: its name
                rules[node] = node.makeCopy(fields)
        return jvm.PythonUtils.toScalaMap(rules)

    def _array(self, values: Sequence[Any]) -> Any:
        jvm: Any = self.spark._jvm
        gateway: Any = self.spark.sparkContext._gateway
        array = gateway.new_array(jvm.java.lang.Object, len(values))
        for i, value in enumerate(values):
            array[i] = value
        return array

    def _observation(self, name: str, dataframe: int) -> Observation:
        return observation_of(self.spark, name, dataframe)


def observation_of(spark: SparkSession, name: str, dataframe: int) -> Observation:
    """A PySpark ``Observation`` of ``name`` that the session completes when a query
    holding the ``CollectMetrics`` of that name and ``dataframe`` id ends, as
    ``DataFrame.observe`` would have registered it."""
    from pyspark.sql import Observation

    jvm: Any = spark._jvm
    observation = Observation(name)
    observation._jvm = jvm
    observation._jo = getattr(jvm, "org.apache.spark.sql.Observation")(name)
    spark._jsparkSession.observationManager().register(observation._jo, dataframe)
    return observation


class Repointed:
    """One later attempt's frames: each template frame re-pointed when first asked for,
    and its observations."""

    def __init__(
        self,
        spark: SparkSession,
        rule: Any,
        observations: dict[int, Any],
        places: Mapping[int, int],
    ) -> None:
        self.spark = spark
        self._rule = rule
        self._observations = observations
        self._places = places
        self._made: dict[int, DataFrame] = {}

    def frame(self, template: DataFrame) -> DataFrame:
        """``template`` re-pointed (made once per attempt)."""
        from pyspark.sql import DataFrame as ClassicFrame

        found = self._made.get(id(template))
        if found is None:
            jvm: Any = self.spark._jvm
            plan = template._jdf.logicalPlan().transformDown(self._rule)
            # What changed are leaves of the same attributes and observations' names:
            # the template's analysis holds, and Spark's analyser passes an analysed plan.
            plan.setAnalyzed()
            dataset = jvm.org.apache.spark.sql.classic.Dataset.ofRows(
                self.spark._jsparkSession, plan
            )
            found = self._made[id(template)] = ClassicFrame(dataset, self.spark)
        return found

    def later(self, template: DataFrame) -> Any:
        """``template`` re-pointed when first used (``Deferred``)."""
        return Deferred(lambda: self.frame(template))

    def observation(self, template: DataFrame) -> Any:
        """The attempt's own observation in place of ``template``'s (an ``observed``)."""
        return self._observations[self._places[id(template)]]


class Deferred:
    """A frame made when first used: every attribute is the made frame's. For the
    ledger's frames, which only a failed check reads."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._frame: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._frame is None:
            self._frame = self._make()
        return getattr(self._frame, name)


class LazyInputs(Mapping[str, Any]):
    """A committer's inputs, each re-pointed when first read."""

    def __init__(self, templates: Mapping[str, Any], repointed: Repointed) -> None:
        self._templates = templates
        self._repointed = repointed

    def __getitem__(self, name: str) -> Any:
        return self._repointed.frame(self._templates[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._templates)

    def __len__(self) -> int:
        return len(self._templates)


def _observations_in(plan: Any, names: Container[str]) -> list[Any]:
    """The ``CollectMetrics`` nodes of ``plan`` whose name is in ``names`` (every node
    visited: a few round trips each, once per template)."""
    found = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if str(node.nodeName()) == "CollectMetrics" and str(node.name()) in names:
            found.append(node)
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return found


def _fields(node: Any) -> list[Any]:
    """A plan node's fields, as ``makeCopy`` takes them."""
    return [node.productElement(i) for i in range(node.productArity())]


def _kept_leaf(node: Any) -> bool:
    """Whether ``node`` is a checkpoint's relation."""
    return str(node.nodeName()) == KEPT_LEAF


def _chain(plan: Any) -> list[Any] | None:
    """``plan`` and its descendants down to its leaf, if each has one child."""
    chain = [plan]
    while len(chain) <= CHAIN:
        children = chain[-1].children()
        size = children.size()
        if size == 0:
            return chain
        if size > 1:
            return None
        chain.append(children.head())
    return None


def _shape(chain: list[Any]) -> list[tuple[str, int | None]]:
    """What must be alike in two batches' chains: each node's kind, and a coalesce's
    partition count."""
    return [
        (str(n.nodeName()), int(n.numPartitions()) if str(n.nodeName()) == COALESCE else None)
        for n in chain
    ]


def _relations(plan: Any) -> list[tuple[Any, int]]:
    """The leaves of ``plan`` that are an RDD's relation (a checkpoint's), each with its
    RDD's id."""
    leaves = plan.collectLeaves()
    found = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if str(leaf.nodeName()) == KEPT_LEAF:
            found.append((leaf, int(leaf.rdd().id())))
    return found


#: The column of a fused frame that says which frame a row is of.
TAG = "__transactional_frame"


class Fused:
    """Frames collected by one Spark job instead of one each (``frames``, by key): the
    union of them, each row tagged with its frame's place and holding its columns under
    names of its own, the other frames' null. Built once, over a template's frames, and
    re-pointed with them: only for batches of one task, where a job costs more than the
    rows (a large batch's union of shuffled frames took three times as long as its
    frames one by one: benchmarks/analysis.md)."""

    def __init__(self, frames: Mapping[Any, DataFrame]) -> None:
        from pyspark.sql import functions as F

        self.keys = list(frames)
        fields = [
            (place, column, field)
            for place, frame in enumerate(frames.values())
            for column, field in enumerate(frame.schema.fields)
        ]
        self.names = {
            place: [(f"c{place}_{column}", field.name) for p, column, field in fields if p == place]
            for place in range(len(self.keys))
        }
        parts = []
        for place, frame in enumerate(frames.values()):
            columns = [F.lit(place).alias(TAG)]
            for p, column, field in fields:
                name = f"c{p}_{column}"
                if p == place:
                    columns.append(F.col(f"`{field.name}`").alias(name))
                else:
                    columns.append(F.lit(None).cast(field.dataType).alias(name))
            parts.append(frame.select(*columns))
        union = parts[0]
        for part in parts[1:]:
            union = union.union(part)
        self.frame = union

    def split(self, table: pa.Table, schemas: Mapping[Any, pa.Schema]) -> dict[Any, pa.Table]:
        """The fused frame's collected ``table`` as each frame's own, in the schema its
        own collect gave it (``schemas``: a union makes every column nullable)."""
        import pyarrow.compute as pc

        tags = table.column(TAG)
        split = {}
        for place, key in enumerate(self.keys):
            own = table.filter(pc.equal(tags, place))
            names = self.names[place]
            own = own.select([name for name, _ in names]).rename_columns([n for _, n in names])
            split[key] = own.cast(schemas[key])
        return split


def one_task(batch: DataFrame) -> bool:
    """Whether ``batch`` (``materialise``'s) is coalesced to one task."""
    chain = _chain(batch._jdf.logicalPlan())
    return chain is not None and (COALESCE, 1) in _shape(chain)


def one_stage(frame: DataFrame) -> bool:
    """Whether ``frame``'s job is one stage: no exchange (a shuffle or a broadcast) in its
    physical plan, so that every observation in it is made by the result stage, whose
    tasks' updates Spark applies once each."""
    plan = frame._jdf.queryExecution().executedPlan()
    return "Exchange" not in str(plan.toString())


def holds(frame: DataFrame, observed: DataFrame) -> bool:
    """Whether ``frame``'s plan holds ``observed``'s observation (``observed``'s root is
    a ``CollectMetrics``)."""
    name = str(observed._jdf.logicalPlan().name())
    return bool(_observations_in(frame._jdf.logicalPlan(), {name}))
