"""The torch backend's negotiation rules (src/clipbert_legacy/compat/hvd/torch_backend/negotiation.py),
Horovod's coordinator logic without processes: operations are matched by name whatever order the ranks
issued them in, mismatches become one error for every rank, joined ranks count as ready, and the last rank
to join is reported."""
from clipbert_legacy.compat.hvd.torch_backend.negotiation import JOIN, LEAVE, STOP, WAIT, Negotiation


def ev(rank, name, kind="ALLREDUCE", shape=(3,), dtype="torch.float32", **meta):
    m = {"dt": [dtype], "sh": [list(shape)], "dev": "cpu", "op": "average", "pre": 1.0, "post": 1.0, **meta}
    return {"r": rank, "n": name, "k": kind, "m": m}


def test_matched_by_name_not_by_order():
    neg = Negotiation([0, 1])
    assert neg.add(ev(0, "a")) == [] and neg.add(ev(0, "b")) == []
    assert [r["n"] for r in neg.add(ev(1, "b"))] == ["b"]  # rank 1 issued b first: b runs first
    (a,) = neg.add(ev(1, "a"))
    assert a["n"] == "a" and a["err"] is None and a["joined"] == []
    assert neg.pending() == {}


def test_pending_names_the_missing_ranks():
    neg = Negotiation([0, 1, 2])
    neg.add(ev(0, "x"))
    neg.add(ev(2, "x"))
    assert neg.pending() == {"x": [1]}


def test_mismatches_are_errors_naming_each_rank():
    cases = [(ev(0, "s", shape=(3,)), ev(1, "s", shape=(4,)),
              "mismatched tensor shapes (rank 0: [3], rank 1: [4])"),
             (ev(0, "t"), ev(1, "t", dtype="torch.int32"), "mismatched data types"),
             (ev(0, "k"), ev(1, "k", kind="ALLGATHER"), "mismatched operations"),
             (ev(0, "b", kind="BROADCAST", root=0), ev(1, "b", kind="BROADCAST", root=1),
              "mismatched root ranks"),
             (ev(0, "o", op="sum"), ev(1, "o", op="min"), "mismatched reduction ops"),
             (ev(0, "f", pre=0.5), ev(1, "f", pre=1.0), "mismatched prescale/postscale factors"),
             (ev(0, "g", kind="ALLGATHER", shape=(2, 3)), ev(1, "g", kind="ALLGATHER", shape=(5, 4)),
              "beyond the first dimension"),
             (ev(0, "z", kind="REDUCESCATTER", shape=()), ev(1, "z", kind="REDUCESCATTER", shape=()),
              "scalar"),
             (ev(0, "d"), ev(1, "d", dev="cuda"), "CPU/GPU")]
    for e0, e1, words in cases:
        neg = Negotiation([0, 1])
        neg.add(e0)
        (resp,) = neg.add(e1)
        assert resp["err"] and words in resp["err"], (words, resp["err"])
        assert resp["err"].startswith(f"{e0['k']} '{e0['n']}'")


def test_allgather_with_uneven_first_dims_is_fine_and_reports_the_shapes():
    neg = Negotiation([0, 1])
    neg.add(ev(0, "g", kind="ALLGATHER", shape=(2, 3)))
    (resp,) = neg.add(ev(1, "g", kind="ALLGATHER", shape=(5, 3)))
    assert resp["err"] is None and resp["shapes"] == [[[2, 3]], [[5, 3]]]


def test_join_makes_allreduces_ready_and_refuses_allgather():
    neg = Negotiation([0, 1, 2])
    neg.add({"r": 2, "n": "join", "k": JOIN, "m": {}})
    neg.add(ev(0, "x"))
    (x,) = neg.add(ev(1, "x"))
    assert x["err"] is None and x["joined"] == [2]  # rank 2 adds zeros
    neg.add(ev(0, "g", kind="ALLGATHER", shape=(1,)))
    (g,) = neg.add(ev(1, "g", kind="ALLGATHER", shape=(1,)))
    assert "Allgather is not supported with Join" in g["err"]
    neg.add(ev(0, "rows", kind="ALLGATHER", shape=(2, 3), jo=True))  # internal: a joined rank gives no rows
    (rows,) = neg.add(ev(1, "rows", kind="ALLGATHER", shape=(1, 3), jo=True))
    assert rows["err"] is None and rows["shapes"][2] == [[0, 3]]


def test_last_to_join_is_reported_after_pending_work():
    neg = Negotiation([0, 1])
    neg.add({"r": 1, "n": "join", "k": JOIN, "m": {}})
    (late,) = neg.add(ev(0, "late"))  # rank 1 joined: rank 0's op runs at once, with rank 1's zeros
    assert late["joined"] == [1]
    neg.add({"r": 0, "n": "join", "k": JOIN, "m": {}})
    assert neg.joined == {}  # both joined: the next join starts afresh
    neg = Negotiation([0, 1])
    neg.add(ev(0, "async_before_join"))
    assert neg.add({"r": 0, "n": "join", "k": JOIN, "m": {}}) == []
    out = neg.add({"r": 1, "n": "join", "k": JOIN, "m": {}})  # rank 1 never submitted it, then joined
    assert [r["n"] for r in out] == ["async_before_join", "join"] and out[-1]["last"] == 1


def test_stop_once_every_member_left():
    neg = Negotiation([0, 1])
    assert neg.add({"r": 0, "n": LEAVE, "k": LEAVE, "m": {}}) == []
    assert neg.add({"r": 1, "n": LEAVE, "k": LEAVE, "m": {}}) == [{"k": STOP, "n": STOP}]


def test_a_rank_that_left_fails_what_waits_for_it_and_what_comes_after():
    """Horovod's shutdown rule: once a member has left, an operation that needs it can never run; its
    submitters get an error (not a wait forever), now and for every later submission."""
    neg = Negotiation([0, 1])
    assert neg.add({"r": 0, "n": "x", "k": "ALLREDUCE", "m": {"sh": [[2]], "dt": ["float32"]}}) == []
    gone = neg.add({"r": 1, "n": LEAVE, "k": LEAVE, "m": {}})
    assert [(g["n"], g["k"]) for g in gone] == [("x", "ALLREDUCE")]
    assert "has been shut down: rank(s) 1 finished execution" in gone[0]["err"]
    later = neg.add({"r": 0, "n": "y", "k": "BROADCAST", "m": {"sh": [[2]], "dt": ["float32"]}})
    assert len(later) == 1 and later[0]["n"] == "y" and "shut down" in later[0]["err"]
    assert neg.pending() == {}
    assert neg.add({"r": 0, "n": LEAVE, "k": LEAVE, "m": {}}) == [{"k": STOP, "n": STOP}]


def wait(rank, name):
    return {"r": rank, "n": name, "k": WAIT, "m": {}}


def test_ranks_waiting_on_each_other_fail_and_stop_the_set():
    """Rank 0 waits in a barrier rank 1 never submitted; rank 1 went on and waits in an allreduce rank 0
    never submitted: neither can go on, so both get an error naming where each waits, then STOP."""
    neg = Negotiation([0, 1])
    assert neg.add(ev(0, "barrier.noname.1", kind="BARRIER")) == []
    assert neg.add(wait(0, "barrier.noname.1")) == []  # rank 1 may still submit it
    assert neg.add(ev(1, "x")) == []
    out = neg.add(wait(1, "x"))
    assert [r["n"] for r in out] == ["barrier.noname.1", "x", STOP]
    for r in out[:2]:
        assert "every rank waits on an operation that another rank has not submitted" in r["err"]
        assert ("rank 0 waits in BARRIER 'barrier.noname.1', not submitted by rank 1; "
                "rank 1 waits in ALLREDUCE 'x', not submitted by rank 0") in r["err"]
    assert neg.pending() == {}


def test_a_rank_that_stopped_waiting_or_whose_wait_completes_is_no_deadlock():
    neg = Negotiation([0, 1])
    neg.add(ev(0, "a"))
    neg.add(wait(0, "a"))
    neg.add(ev(1, "b"))
    assert neg.add(wait(1, "")) == []  # rank 1 no longer waits (its wait on something else ended)
    (a,) = neg.add(ev(1, "a"))  # rank 1 submits a: it runs; rank 0's wait is over
    assert a["n"] == "a" and a["err"] is None
    assert neg.add(wait(1, "b")) == []  # rank 0 still reports a, which is no longer pending
    (b,) = neg.add(ev(0, "b"))
    assert b["n"] == "b" and b["err"] is None


def test_a_joined_rank_waiting_in_join_counts_as_stuck():
    neg = Negotiation([0, 1, 2])
    neg.add({"r": 2, "n": "join", "k": JOIN, "m": {}})
    neg.add(wait(2, "join"))
    neg.add(ev(0, "p", kind="BROADCAST", root=0))
    neg.add(wait(0, "p"))
    assert neg.add(ev(1, "q", kind="BROADCAST", root=0)) == []
    out = neg.add(wait(1, "q"))
    assert [r["n"] for r in out] == ["p", "q", STOP]
    assert "rank 2 waits in join" in out[0]["err"]
