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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        jvm: Any = spark._jvm
        self._relation = getattr(jvm, "org.apache.spark.sql.execution.LogicalRDD")
        self._unknown = getattr(jvm, f"{_PHYSICAL}.UnknownPartitioning")
        self._nil = getattr(getattr(jvm, "scala.collection.immutable.Nil$"), "MODULE$")
        self._none = getattr(getattr(jvm, "scala.None$"), "MODULE$")
        self._observation_class = getattr(jvm, "org.apache.spark.sql.Observation")
        self._observations = spark._jsparkSession.observationManager()
        self._lock = threading.Lock()
        #: Every relation over the template batch's rows, as the frames hold it: the
        #: analyser gives one side of a union (or a join) of the batch with itself
        #: attributes of its own, so there may be several.
        self.leaves = leaves
        #: The observations to rename: the template's ``CollectMetrics`` nodes, each
        #: with its fields as ``makeCopy`` takes them (the first, its name, set anew).
        self.observed = [frame._jdf.logicalPlan() for frame in observed]
        #: Each observed frame's place in ``observed``, by the frame (which it keeps).
        self._places = {id(frame): place for place, frame in enumerate(observed)}
        self._frames = list(observed)
        self._fields = [self._array(_fields(node)) for node in self.observed]
        self._ids = [int(node.dataframeId()) for node in self.observed]

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
        try:
            stand_in = spark.range(0)._jdf.queryExecution().toRdd()
            rule = replan._rule(stand_in, ())
            for plan in plans:
                if any(rdd == gone for _, rdd in _relations(plan.transformDown(rule))):
                    return None
        except Py4JError:
            return None
        return replan

    def over(self, now: DataFrame) -> Repointed | None:
        """The frames re-pointed at ``now`` (as each is asked for); None: ``now`` is not
        a batch of the same schema and shape (its coalesce's partition count among it),
        and the attempt builds its plans anew."""
        plan = now._jdf.logicalPlan()
        if not self.schema.equals(plan.schema()):
            return None
        chain = _chain(plan)
        if chain is None or _shape(chain) != self.shape or not _kept_leaf(chain[-1]):
            return None
        names = [f"ledger-{uuid.uuid4().hex}" for _ in self.observed]
        observations = {
            place: self._observation(name, dataframe)
            for place, (name, dataframe) in enumerate(zip(names, self._ids, strict=True))
        }
        rule = self._rule(chain[-1].rdd(), names)
        return Repointed(self.spark, rule, observations, self._places)

    def _rule(self, rdd: Any, names: Sequence[str]) -> Any:
        """The map ``transformDown`` applies: each of ``leaves`` to a relation of the
        same attributes over ``rdd``; each observation to one named as ``names`` says
        (none: the observations are left as they are).

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
        for node, fields, name in zip(self.observed, self._fields, names, strict=False):
            with self._lock:  # the fields are shared by the attempts in flight
                fields[0] = name  # CollectMetrics' first field: its name
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
        """A PySpark ``Observation`` of ``name`` that the session completes when a query
        holding the ``CollectMetrics`` of that name and ``dataframe`` id ends, as
        ``DataFrame.observe`` would have registered it."""
        from pyspark.sql import Observation

        observation = Observation(name)
        observation._jvm = self.spark._jvm
        observation._jo = self._observation_class(name)
        self._observations.register(observation._jo, dataframe)
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
