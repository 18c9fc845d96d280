import pickle

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto


def make(n=4, meta=None):
    return DataProto.from_dict(
        {"x": torch.arange(n * 2).reshape(n, 2), "y": torch.arange(n, dtype=torch.float32)},
        {"uid": [f"u{i}" for i in range(n)]},
        meta or {"temperature": 1.0},
    )


def rows(d):
    return d.batch["x"][:, 0].tolist()


# ---------------------------------------------------------------- construction
def test_from_dict_makes_object_arrays_and_len():
    d = make(3)
    assert len(d) == 3
    assert d.non_tensor_batch["uid"].dtype == object
    assert d.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"]
    assert d.meta_info == {"temperature": 1.0}


def test_from_dict_object_column_keeps_nested_values():
    d = DataProto.from_dict({"x": torch.zeros(2, 1)}, {"info": [{"a": 1}, [1, 2]]})
    assert d.non_tensor_batch["info"][0] == {"a": 1}
    assert d.non_tensor_batch["info"][1] == [1, 2]


def test_from_dict_length_mismatch_names_key_and_lengths():
    with pytest.raises(ValueError, match=r"'b' has 3 rows but column 'a' has 2"):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"non-tensor column 'uid' has 5 rows"):
        DataProto.from_dict({"a": torch.zeros(2)}, {"uid": list("abcde")})


def test_from_dict_rejects_non_tensor_and_scalar_columns():
    with pytest.raises(TypeError, match="'a' must be a torch.Tensor"):
        DataProto.from_dict({"a": [1, 2]})
    with pytest.raises(ValueError, match="0-dimensional"):
        DataProto.from_dict({"a": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="must be a sequence"):
        DataProto.from_dict({"a": torch.zeros(2)}, {"s": "ab"})


def test_same_key_tensor_and_non_tensor_is_error():
    with pytest.raises(ValueError, match="both tensor and non-tensor"):
        DataProto.from_dict({"k": torch.zeros(2)}, {"k": ["a", "b"]})


# -------------------------------------------------------------------- indexing
def test_int_index_keeps_one_row_and_negative_works():
    d = make(4)
    assert rows(d[1]) == [2]
    assert rows(d[-1]) == [6]
    assert d[-1].non_tensor_batch["uid"].tolist() == ["u3"]
    with pytest.raises(IndexError, match="out of range"):
        d[4]


@pytest.mark.parametrize(
    "index",
    [
        slice(1, 3),
        [1, 2],
        np.array([1, 2]),
        torch.tensor([1, 2]),
        torch.tensor([False, True, True, False]),
        [False, True, True, False],
    ],
)
def test_index_kinds_select_rows_1_and_2(index):
    d = make(4)[index]
    assert rows(d) == [2, 4]
    assert d.non_tensor_batch["uid"].tolist() == ["u1", "u2"]
    assert d.meta_info == {"temperature": 1.0}


def test_index_with_repeats_and_order():
    assert rows(make(4)[[3, 0, 3]]) == [6, 0, 6]


def test_empty_list_index_gives_empty():
    assert len(make(4)[[]]) == 0


def test_bad_index_errors():
    with pytest.raises(IndexError, match="bool mask has shape"):
        make(4)[torch.tensor([True, False])]
    with pytest.raises(IndexError, match="index must be"):
        make(4)[torch.tensor([0.5])]


# ------------------------------------------------------------ select / pop
def test_select_subset_and_unknown_key():
    d = make(2)
    s = d.select(batch_keys=["y"], non_tensor_batch_keys=[], meta_info_keys=[])
    assert list(s.batch) == ["y"] and s.non_tensor_batch == {} and s.meta_info == {}
    assert s.batch["y"] is d.batch["y"]  # shared, not copied
    with pytest.raises(KeyError, match=r"batch keys \['z'\] not found; available: \['x', 'y'\]"):
        d.select(batch_keys=["z"])


def test_pop_removes_in_place_and_returns_removed():
    d = make(2)
    out = d.pop(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(out.batch) == ["x"] and list(out.non_tensor_batch) == ["uid"]
    assert out.meta_info == {"temperature": 1.0}
    assert list(d.batch) == ["y"] and d.non_tensor_batch == {} and d.meta_info == {}
    with pytest.raises(KeyError, match="not found"):
        d.pop(batch_keys=["x"])


# -------------------------------------------------------------------- union
def test_union_adds_columns_and_accepts_equal_duplicates():
    d = make(2)
    other = DataProto.from_dict(
        {"x": d.batch["x"].clone(), "z": torch.ones(2)}, {"uid": ["u0", "u1"]}, {"temperature": 1.0, "step": 3}
    )
    out = d.union(other)
    assert out is d
    assert sorted(d.batch) == ["x", "y", "z"]
    assert d.meta_info == {"temperature": 1.0, "step": 3}


def test_union_conflicts_name_the_key():
    d = make(2)
    with pytest.raises(ValueError, match="tensor column 'x' differs"):
        d.union(DataProto.from_dict({"x": torch.zeros(2, 2, dtype=torch.long)}))
    with pytest.raises(ValueError, match="non-tensor column 'uid' differs"):
        d.union(DataProto.from_dict({}, {"uid": ["a", "b"]}))
    with pytest.raises(ValueError, match="meta_info 'temperature'"):
        d.union(DataProto.from_dict({}, None, {"temperature": 0.5}))
    with pytest.raises(ValueError, match="lengths 2 and 3"):
        d.union(DataProto.from_dict({"q": torch.zeros(3)}))
    assert sorted(d.batch) == ["x", "y"]  # failed unions changed nothing


# ---------------------------------------------------------- concat / chunk
def test_chunk_then_concat_round_trips_and_merges_metrics():
    d = make(6)
    parts = d.chunk(3)
    assert [rows(p) for p in parts] == [[0, 2], [4, 6], [8, 10]]
    for i, p in enumerate(parts):
        p.meta_info["metrics"] = {"loss": float(i), "lens": [i, i]}
    out = DataProto.concat(parts)
    assert torch.equal(out.batch["x"], d.batch["x"])
    assert out.non_tensor_batch["uid"].tolist() == d.non_tensor_batch["uid"].tolist()
    assert out.meta_info["metrics"] == {"loss": [0.0, 1.0, 2.0], "lens": [0, 0, 1, 1, 2, 2]}
    assert out.meta_info["temperature"] == 1.0


def test_concat_errors():
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])
    a, b = make(2), make(2, meta={"temperature": 0.7})
    with pytest.raises(ValueError, match="meta_info 'temperature' is 1.0 .* 0.7 in part 1"):
        DataProto.concat([a, b])
    with pytest.raises(ValueError, match="part 1 has columns"):
        DataProto.concat([a, a.select(batch_keys=["x"])])


def test_chunk_not_divisible_says_how_to_pad():
    with pytest.raises(ValueError, match=r"cannot chunk 5 rows into 2 .*pad_to_divisor\(2\)"):
        make(5).chunk(2)


def test_split_last_part_shorter():
    assert [rows(p) for p in make(5).split(2)] == [[0, 2], [4, 6], [8]]
    with pytest.raises(ValueError, match="positive"):
        make(2).split(0)


# ----------------------------------------------------------- repeat / reorder
def test_repeat_interleave_and_tile():
    d = make(2)
    assert rows(d.repeat(3, interleave=True)) == [0, 0, 0, 2, 2, 2]
    assert d.repeat(2).non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1"]
    assert rows(d.repeat(2, interleave=False)) == [0, 2, 0, 2]
    assert d.repeat(2, interleave=False).non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1"]
    assert d.repeat(2).batch["x"].shape == (4, 2)
    with pytest.raises(ValueError, match=">= 1"):
        d.repeat(0)


def test_reorder_in_place_and_validates_permutation():
    d = make(3)
    d.reorder([2, 0, 1])
    assert rows(d) == [4, 0, 2]
    assert d.non_tensor_batch["uid"].tolist() == ["u2", "u0", "u1"]
    with pytest.raises(ValueError, match="permutation"):
        d.reorder([0, 0, 1])


# --------------------------------------------------------------- padding
def test_pad_to_divisor_and_unpad():
    d = make(5)
    padded, pad = d.pad_to_divisor(4)
    assert pad == 3 and len(padded) == 8
    assert rows(padded) == [0, 2, 4, 6, 8, 0, 2, 4]  # filled with copies of the first rows
    back = padded.unpad(pad)
    assert torch.equal(back.batch["x"], d.batch["x"])
    assert back.non_tensor_batch["uid"].tolist() == d.non_tensor_batch["uid"].tolist()
    same, zero = d.pad_to_divisor(5)
    assert zero == 0 and same is d and d.unpad(0) is d


def test_pad_more_than_length_cycles_rows():
    padded, pad = make(1).pad_to_divisor(4)
    assert pad == 3 and rows(padded) == [0, 0, 0, 0]


def test_padding_errors():
    with pytest.raises(ValueError, match="positive"):
        make(2).pad_to_divisor(0)
    with pytest.raises(ValueError, match=r"pad_size must be in \[0, 2\]"):
        make(2).unpad(3)


# -------------------------------------------------------------- iteration
def test_make_iterator_epochs_and_sizes():
    batches = list(make(4).make_iterator(mini_batch_size=2, epochs=2))
    assert [rows(b) for b in batches] == [[0, 2], [4, 6], [0, 2], [4, 6]]


def test_make_iterator_shuffle_is_seeded_permutation():
    a = [rows(b) for b in make(8).make_iterator(4, epochs=2, shuffle=True, seed=3)]
    b = [rows(b) for b in make(8).make_iterator(4, epochs=2, shuffle=True, seed=3)]
    assert a == b
    first_epoch = sorted(a[0] + a[1])
    assert first_epoch == [0, 2, 4, 6, 8, 10, 12, 14]
    assert a[0] + a[1] != [0, 2, 4, 6, 8, 10, 12, 14] or a[2] + a[3] != [0, 2, 4, 6, 8, 10, 12, 14]


def test_make_iterator_bad_size():
    with pytest.raises(ValueError, match="must be positive and divide the batch length 4"):
        next(make(4).make_iterator(3))


# ---------------------------------------------------------- device / copy
def test_to_moves_in_place():
    d = make(2)
    assert d.to("cpu") is d and d.batch["x"].device.type == "cpu"


def test_deepcopy_is_independent():
    d = make(2)
    c = d.deepcopy()
    c.batch["x"][0, 0] = 99
    c.non_tensor_batch["uid"][0] = "changed"
    assert d.batch["x"][0, 0] == 0 and d.non_tensor_batch["uid"][0] == "u0"


# ---------------------------------------------------------- serialization
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8])
def test_pickle_round_trip_preserves_dtype_shape_values(dtype):
    x = (torch.arange(24).reshape(2, 3, 4) % 3).to(dtype)
    d = DataProto.from_dict({"x": x}, {"s": ["a", "b"]}, {"m": 1})
    back = pickle.loads(pickle.dumps(d, protocol=5))
    assert back.batch["x"].dtype == dtype and back.batch["x"].shape == (2, 3, 4)
    assert torch.equal(back.batch["x"], x)
    assert back.non_tensor_batch["s"].tolist() == ["a", "b"] and back.meta_info == {"m": 1}


def test_pickle_of_non_contiguous_view():
    base = torch.arange(12.0).reshape(3, 4)
    d = DataProto.from_dict({"x": base.t()})
    back = pickle.loads(pickle.dumps(d))
    assert torch.equal(back.batch["x"], base.t())


def test_pickle_stores_tensors_as_out_of_band_buffers():
    d = DataProto.from_dict({"x": torch.zeros(1000, 100)})
    buffers = []
    payload = pickle.dumps(d, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and buffers[0].raw().nbytes == 1000 * 100 * 4
    assert len(payload) < 2000  # the tensor bytes are not in the pickle stream
    back = pickle.loads(payload, buffers=buffers)
    assert back.batch["x"].shape == (1000, 100)


def test_unpickled_read_only_buffer_becomes_writable_tensor():
    d = DataProto.from_dict({"x": torch.ones(4)})
    buffers = []
    payload = pickle.dumps(d, protocol=5, buffer_callback=buffers.append)
    read_only = [pickle.PickleBuffer(memoryview(bytes(b.raw()))) for b in buffers]
    back = pickle.loads(payload, buffers=read_only)
    back.batch["x"] += 1  # must not fail or touch the (immutable) source bytes
    assert back.batch["x"].tolist() == [2.0, 2.0, 2.0, 2.0]


def test_repr_mentions_shapes():
    assert "x: (2, 2) int64" in repr(make(2))


# ------------------------------------------------ edges the mutation run found untested
def id_rows(n):
    return DataProto.from_dict({"x": torch.arange(n * 2).reshape(n, 2)}, {"id": [f"r{i}" for i in range(n)]})


def test_concat_refuses_a_part_with_fewer_non_tensor_columns():
    short = DataProto.from_dict({"x": torch.zeros(1, 2, dtype=torch.long)})
    with pytest.raises(ValueError, match="concat: part 1 has columns"):
        DataProto.concat([id_rows(2), short])


def test_concat_of_one_part_and_of_parts_that_carry_gradients():
    assert DataProto.concat([id_rows(3)]).non_tensor_batch["id"].tolist() == ["r0", "r1", "r2"]
    a = torch.ones(2, 1, requires_grad=True)
    out = DataProto.concat([DataProto.from_dict({"x": a}), DataProto.from_dict({"x": a * 2})])
    out.batch["x"].sum().backward()  # torch.cat keeps the graph (numpy's concatenate cannot)
    assert a.grad.tolist() == [[3.0], [3.0]]


def test_concat_keeps_meta_keys_that_sort_before_metrics():
    parts = [id_rows(1), id_rows(1)]
    for part in parts:
        part.meta_info.update({"epoch": 2, "metrics": {"loss": 1.0}})
    merged = DataProto.concat(parts).meta_info
    assert merged == {"epoch": 2, "metrics": {"loss": [1.0, 1.0]}}


def test_a_tensor_and_a_number_are_different_meta_values():
    here = DataProto.from_dict(meta_info={"scale": torch.tensor(1)})
    with pytest.raises(ValueError, match="union conflict: meta_info 'scale'"):
        here.union(DataProto.from_dict(meta_info={"scale": 1}))


def test_a_non_tensor_column_shorter_than_the_tensors_is_refused():
    with pytest.raises(ValueError, match="non-tensor column 'id' has 2 rows but column 'x' has 3"):
        DataProto.from_dict({"x": torch.zeros(3, 1)}, {"id": ["a", "b"]})


def test_int_index_takes_one_row_anywhere():
    data = id_rows(4)
    assert [data[i].non_tensor_batch["id"].tolist() for i in (0, 2, 3, -1)] == [["r0"], ["r2"], ["r3"], ["r3"]]
    with pytest.raises(IndexError, match="1-D integer sequence"):
        data[torch.tensor([[0, 1]])]


def test_repeat_once_split_by_one_and_three_dimensional_columns():
    data = id_rows(2)
    assert torch.equal(data.repeat(1).batch["x"], data.batch["x"])
    assert [len(p) for p in data.split(1)] == [1, 1]
    cube = DataProto.from_dict({"v": torch.arange(8).reshape(2, 2, 2), "w": torch.arange(16).reshape(2, 2, 2, 2)})
    tiled = cube.repeat(2, interleave=False)
    assert torch.equal(tiled.batch["v"], torch.cat([cube.batch["v"]] * 2))
    assert torch.equal(tiled.batch["w"], torch.cat([cube.batch["w"]] * 2))


def test_the_iterator_runs_one_epoch_unless_asked_and_refuses_none():
    assert len(list(id_rows(4).make_iterator(2))) == 2
    with pytest.raises(ValueError, match="epochs must be >= 1, got 0"):
        list(id_rows(4).make_iterator(2, epochs=0))


def test_nbytes_counts_tensor_buffers_and_pickled_object_columns():
    data = id_rows(2)  # x: 2 x 2 int64 = 32 bytes; id: an object column, counted as pickled
    assert data.nbytes() == 32 + len(pickle.dumps(data.non_tensor_batch["id"], protocol=5))


def test_a_received_buffer_is_copied_only_when_read_only():
    from hybridflow.core.data_proto import _numpy_to_tensor

    writable = np.arange(4, dtype=np.int64)
    assert np.shares_memory(_numpy_to_tensor(writable, "int64").numpy(), writable)  # zero-copy
    frozen = np.arange(4, dtype=np.int64)
    frozen.flags.writeable = False
    t = _numpy_to_tensor(frozen, "int64")
    t += 1  # torch needs memory of its own to write: the read-only buffer is left as it was
    assert frozen.tolist() == [0, 1, 2, 3] and t.tolist() == [1, 2, 3, 4]


def test_out_of_range_rows_and_lengths_are_refused():
    data = id_rows(4)
    for bad in (4, -5):
        with pytest.raises(IndexError, match=f"row {bad} out of range"):
            data[bad]
    with pytest.raises(ValueError, match="cannot union DataProtos of lengths 4 and 3"):
        data.union(id_rows(3))
    assert [p.non_tensor_batch["id"].tolist() for p in data.chunk(2)] == [["r0", "r1"], ["r2", "r3"]]


def test_columns_must_have_a_batch_dimension_and_non_tensors_one_dimension():
    with pytest.raises(ValueError, match="tensor column 'x' is 0-dimensional"):
        DataProto.from_dict({"x": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="non-tensor column 'id' must be a 1-D numpy array"):
        DataProto({}, {"id": np.empty((2, 2), dtype=object)})
    column = np.array(["a", "b"], dtype=object)
    assert DataProto.from_dict(non_tensors={"id": column}).non_tensor_batch["id"] is column  # kept, not copied
    numbers = DataProto.from_dict(non_tensors={"n": np.arange(2)}).non_tensor_batch["n"]
    assert numbers.dtype == object and numbers.tolist() == [0, 1]
    assert len(DataProto.from_dict()) == 0


def test_a_bool_mask_must_have_one_entry_per_row():
    with pytest.raises(IndexError, match=r"bool mask has shape \(5,\), expected \(4,\)"):
        id_rows(4)[torch.ones(5, dtype=torch.bool)]


def test_sizes_of_one_and_uneven_sizes():
    data = id_rows(5)
    assert len(data.chunk(1)) == 1 and data.pad_to_divisor(1) == (data, 0)
    with pytest.raises(ValueError, match="cannot chunk 5 rows into 3 equal parts"):
        data.chunk(3)
    with pytest.raises(ValueError, match="must be positive and divide"):
        list(data.make_iterator(0))
    with pytest.raises(ValueError, match="cannot pad an empty DataProto"):
        DataProto.from_dict({"x": torch.zeros(0, 1)}).pad_to_divisor(2)


def test_union_compares_meta_values_and_long_columns_by_value():
    for mine, theirs in ((1, 2), (torch.tensor(1), torch.tensor(2))):
        with pytest.raises(ValueError, match="union conflict: meta_info 'step'"):
            DataProto.from_dict(meta_info={"step": mine}).union(DataProto.from_dict(meta_info={"step": theirs}))
    long = [f"r{i}" for i in range(300)]  # past CPython's cached small ints
    merged = DataProto.from_dict(non_tensors={"id": long}).union(DataProto.from_dict(non_tensors={"id": list(long)}))
    assert len(merged) == 300


def test_a_two_dimensional_object_array_becomes_a_column_of_its_rows():
    pairs = np.array([["a", "b"], ["c", "d"]], dtype=object)
    column = DataProto.from_dict(non_tensors={"pair": pairs}).non_tensor_batch["pair"]
    assert column.shape == (2,) and [list(row) for row in column] == [["a", "b"], ["c", "d"]]
