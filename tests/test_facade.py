"""A facade's method carries its part's docstring, less the parameters the method does not take."""

from __future__ import annotations

import inspect

import gear_flow as gf
from gear_flow.distributed import checkpoints, info
from gear_flow.distributed.facade import documented_as
from gear_flow.distributed.host import ShardHost
from gear_flow.distributed.host_sampling import HostSampler


def _documented(doc: str) -> list[str]:
    lines = doc.splitlines()
    if "Parameters" not in [x.strip() for x in lines]:
        return []
    i = [x.strip() for x in lines].index("Parameters")
    indent = len(lines[i]) - len(lines[i].lstrip())
    i += 2
    names = []
    while i < len(lines) and lines[i].strip():
        if len(lines[i]) - len(lines[i].lstrip()) == indent:
            names.append(lines[i].split(":")[0].strip().lstrip("*"))
        i += 1
    return names


def test_the_handle_the_part_is_given_is_not_documented_on_the_facade():
    assert _documented(checkpoints.checkpoint.__doc__)[0] == "table"  # the part documents its handle ...
    assert _documented(gf.DistributedTable.checkpoint.__doc__) == ["path"]  # ... the method has none to take
    assert _documented(gf.DistributedTable.restore.__doc__)[0] == "client"  # a classmethod's cls neither
    assert _documented(info.info.__doc__) == ["table"]
    assert "Parameters" not in gf.DistributedTable.info.__doc__  # nothing left: no section
    assert "Returns" in gf.DistributedTable.info.__doc__


def test_a_method_taking_every_parameter_keeps_them_in_order():
    want = [p for p in inspect.signature(HostSampler.sample_part).parameters if p != "self"]
    assert _documented(ShardHost.sample_part.__doc__) == want == _documented(HostSampler.sample_part.__doc__)


def test_the_rest_of_the_text_is_the_parts():
    def part(table: object, x: int) -> None:
        """Do it.

        Parameters
        ----------
        table : object
            The handle.
        x : int
            How much; a long text
            over two lines.

        Returns
        -------
        None
        """

    @documented_as(part)
    def method(self, x: int) -> None:
        pass

    assert method.__doc__ == part.__doc__.replace("        table : object\n            The handle.\n", "")
