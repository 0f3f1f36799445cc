"""IdentityCache (dp_spark.release.identity_cache): one entry per path at one table identity,
families accumulating at that identity, replaced at another, least recently used paths
dropped beyond the limit read at each insertion; copies in and out; thread-safe."""

from __future__ import annotations

import threading

from dp_spark.release.identity_cache import IdentityCache


def test_families_accumulate_at_one_identity_and_a_new_identity_replaces_them():
    c = IdentityCache(lambda: 8)
    c.put("p", ("id", 1), {"dau": [1]})
    c.put("p", ("id", 1), {"aov": [2]})
    assert c.get("p", ("id", 1), ["dau", "aov"]) == {"dau": [1], "aov": [2]}
    c.put("p", ("id", 1), {"dau": [3]})  # a family cached again at the same identity: replaced
    assert c.get("p", ("id", 1), ["dau"]) == {"dau": [3]}
    c.put("p", ("id", 2), {"aov": []})  # another identity (a commit): the entry is replaced
    assert c.get("p", ("id", 1), ["aov"]) is None
    assert c.get("p", ("id", 2), ["dau"]) is None  # dau was not read at version 2
    assert c.get("p", ("id", 2), ["aov"]) == {"aov": []}
    c.put("p", ("other", 2), {"aov": [4]})  # a recreated table (same version, new id)
    assert c.get("p", ("id", 2), ["aov"]) is None
    assert c.get("p", None, ["aov"]) is None  # no identity known: never served
    assert c.get("q", ("other", 2), ["aov"]) is None
    assert c.get("p", ("other", 2), []) == {}


def test_values_are_copied_in_and_out():
    c = IdentityCache(lambda: 8)
    rows = [{"state": "current"}]
    c.put("p", ("id", 1), {"dau": rows})
    rows[0]["state"] = "withdrawn"
    got = c.get("p", ("id", 1), ["dau"])["dau"]
    assert got == [{"state": "current"}]
    got[0]["state"] = "superseded"
    assert c.get("p", ("id", 1), ["dau"])["dau"] == [{"state": "current"}]
    calls = []
    shallow = IdentityCache(lambda: 8, copy=lambda v: calls.append(v) or list(v))
    shallow.put("p", ("id", 1), {"dau": [1]})
    shallow.get("p", ("id", 1), ["dau"])
    assert calls == [[1], [1]]  # the caller's copy, in and out


def test_least_recently_used_paths_are_dropped_beyond_the_limit_read_lazily():
    limit = [2]
    c = IdentityCache(lambda: limit[0])
    c.put("p1", ("id", 1), {"f": 1})
    c.put("p2", ("id", 1), {"f": 2})
    assert c.get("p1", ("id", 1), ["f"]) == {"f": 1}  # p1 is now the most recently used
    c.put("p3", ("id", 1), {"f": 3})
    assert list(c) == ["p1", "p3"] and len(c) == 2 and "p2" not in c and "p1" in c
    c.put("p1", ("id", 2), {"f": 4})  # a put makes the path the most recently used too
    assert list(c) == ["p3", "p1"]
    limit[0] = 1  # read at the next insertion
    c.put("p4", ("id", 1), {"f": 5})
    assert list(c) == ["p4"]
    assert c.get("p4", ("id", 1), ["f"]) == {"f": 5}


def test_pop_and_clear():
    c = IdentityCache(lambda: 8)
    c.put("p1", ("id", 1), {"f": [1]})
    c.put("p2", ("id", 1), {"f": [2]})
    assert c.pop("p1") == (("id", 1), {"f": [1]})
    assert c.pop("p1") is None and "p1" not in c
    c.put("p3", ("id", 1), {"f": [3]})
    c.clear("p2")
    c.clear("nowhere")
    assert list(c) == ["p3"]
    c.clear()
    assert len(c) == 0 and list(c) == []


def test_concurrent_use_keeps_the_bound_and_serves_only_what_was_put():
    c = IdentityCache(lambda: 5)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(t: int) -> None:
        try:
            start.wait()
            for i in range(300):
                path = f"p{(t + i) % 9}"
                c.put(path, ("id", i % 3), {f"f{t}": [t, i % 3]})
                hit = c.get(path, ("id", i % 3), [f"f{t}"])
                assert hit is None or hit == {f"f{t}": [t, i % 3]}
                for other in range(8):  # whoever put it: a value at its own identity only
                    got = c.get(path, ("id", i % 3), [f"f{other}"])
                    assert got is None or got[f"f{other}"] == [other, i % 3]
                assert len(c) <= 5
                list(c)
                if i % 50 == 0:
                    c.clear(path)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors[0]
    assert len(c) <= 5
