"""The order ``make bench`` runs its cases in: every case once per repetition, and over
an even number of repetitions every case at each place of the order as often as any
other (the place after a given neighbour changes a case's time by up to 10%)."""

from collections import Counter

from benchmarks.bench import serpentine


def test_each_repetition_runs_every_case_once() -> None:
    for order in serpentine(5, 4):
        assert sorted(order) == [0, 1, 2, 3, 4]


def test_direction_alternates() -> None:
    assert serpentine(3, 3) == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]


def test_places_balance_over_an_even_number_of_repetitions() -> None:
    count, repeat = 6, 4
    places = Counter(
        (case, place) for order in serpentine(count, repeat) for place, case in enumerate(order)
    )
    # A case's places sum to the same total for every case: each is first as often as last.
    totals = {
        case: sum(place * n for (c, place), n in places.items() if c == case)
        for case in range(count)
    }
    assert set(totals.values()) == {(count - 1) * repeat // 2}
    # And no case always follows the same neighbour.
    before = {
        case: {
            order[i - 1]
            for order in serpentine(count, repeat)
            for i in range(1, count)
            if order[i] == case
        }
        for case in range(count)
    }
    assert all(len(b) == 2 for case, b in before.items() if 0 < case < count - 1)
