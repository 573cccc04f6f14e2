"""The compact form of a warm entry's guard checks (runtime/check_table.py) reads back
exactly what was written, whatever paths the strings hold."""

from __future__ import annotations

import json

from minicompile.runtime import check_table

_P = "L_self._modules['features']._modules['denseblock3']._modules['norm1']"
ROWS = [
    ["L['self']", "identity", "L_self is DenseNet", "L_self", ["shown", "<DenseNet>"], ""],
    ["L['x']", "dtype", "L_x.dtype is torch.float32", "L_x.dtype", ["shown", "f32"], "L_x"],
    [f"{_P}._buffers['running_var']", "type", f"type({_P}._buffers.get('running_var')) is T",
     f"type({_P}._buffers.get('running_var'))", ["shown", "T"], ""],
    [f"{_P}.eps", "value", f"{_P}.eps == 1e-05", f"{_P}.eps", 1e-05, ""],
    [f"{_P}.padding[1]", "value", f"{_P}.padding[1] == 1", f"{_P}.padding[1]", 1, _P],
    # keys with brackets, quotes and dots; no path at all; an empty string; a bare root
    ["L['a]b'].c", "value", "L_d['a]b'] == 'x.y' and L_e[''] is None", "L", 2, "L_d"],
    ["G['f.g']", "value", "not (xL_a.b or 3)", "", None, "L_a"],
]


def test_checks_read_back_exactly_through_json() -> None:
    columns = (0, 2, 3, 5)
    encoded = json.loads(json.dumps(check_table.encode(ROWS, columns)))
    assert check_table.decode(encoded) == json.loads(json.dumps(ROWS))


def test_each_path_is_stored_once() -> None:
    encoded = check_table.encode(ROWS, (0, 2, 3, 5))
    text = json.dumps(encoded)
    assert text.count("denseblock3") == 1
