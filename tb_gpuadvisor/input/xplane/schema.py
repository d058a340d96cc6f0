"""The XSpace protobuf schema, declared from its wire-format field numbers.

The profiler writes ``<host>.xplane.pb`` files as a serialized ``XSpace``
message.  Rather than importing TensorFlow (seconds to import) or XProf's
generated modules, the schema is declared here field by field and compiled
into message classes with the ``protobuf`` runtime.  The classes live in a
private descriptor pool under their own package name, so they never clash
with TensorFlow's or XProf's copies when those are loaded in the same
process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "tb_gpuadvisor.xplane"

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _DOUBLE = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_DOUBLE
_STRING, _BYTES, _MESSAGE = _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (message, [(field name, number, type, label, message type or None, oneof index)])
# Field numbers are the on-disk contract of the profiler's XSpace format.
_MESSAGES: list[tuple[str, list[tuple], list[str]]] = [
    ("XSpace", [
        ("planes", 1, _MESSAGE, _MANY, "XPlane", None),
        ("errors", 2, _STRING, _MANY, None, None),
        ("warnings", 3, _STRING, _MANY, None, None),
        ("hostnames", 4, _STRING, _MANY, None, None),
    ], []),
    ("XPlane", [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("lines", 3, _MESSAGE, _MANY, "XLine", None),
        ("event_metadata", 4, _MESSAGE, _MANY, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, _MESSAGE, _MANY, "XPlane.StatMetadataEntry", None),
        ("stats", 6, _MESSAGE, _MANY, "XStat", None),
    ], []),
    ("XLine", [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("timestamp_ns", 3, _INT64, _ONE, None, None),
        ("events", 4, _MESSAGE, _MANY, "XEvent", None),
        ("duration_ps", 9, _INT64, _ONE, None, None),
        ("display_id", 10, _INT64, _ONE, None, None),
        ("display_name", 11, _STRING, _ONE, None, None),
    ], []),
    ("XEvent", [
        ("metadata_id", 1, _INT64, _ONE, None, None),
        ("offset_ps", 2, _INT64, _ONE, None, 0),
        ("duration_ps", 3, _INT64, _ONE, None, None),
        ("stats", 4, _MESSAGE, _MANY, "XStat", None),
        ("num_occurrences", 5, _INT64, _ONE, None, 0),
    ], ["data"]),
    ("XStat", [
        ("metadata_id", 1, _INT64, _ONE, None, None),
        ("double_value", 2, _DOUBLE, _ONE, None, 0),
        ("uint64_value", 3, _UINT64, _ONE, None, 0),
        ("int64_value", 4, _INT64, _ONE, None, 0),
        ("str_value", 5, _STRING, _ONE, None, 0),
        ("bytes_value", 6, _BYTES, _ONE, None, 0),
        ("ref_value", 7, _UINT64, _ONE, None, 0),
    ], ["value"]),
    ("XEventMetadata", [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("metadata", 3, _BYTES, _ONE, None, None),
        ("display_name", 4, _STRING, _ONE, None, None),
        ("stats", 5, _MESSAGE, _MANY, "XStat", None),
        ("child_id", 6, _INT64, _MANY, None, None),
    ], []),
    ("XStatMetadata", [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("description", 3, _STRING, _ONE, None, None),
    ], []),
]

# Map fields are repeated nested "entry" messages with key=1, value=2.
_MAP_ENTRIES = {"XPlane": [("EventMetadataEntry", "XEventMetadata"),
                           ("StatMetadataEntry", "XStatMetadata")]}


def _add_fields(msg: descriptor_pb2.DescriptorProto, fields, oneofs) -> None:
    for name in oneofs:
        msg.oneof_decl.add(name=name)
    for name, number, ftype, label, type_name, oneof in fields:
        field = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            field.type_name = f".{_PACKAGE}.{type_name}"
        if oneof is not None:
            field.oneof_index = oneof


def _build_file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="tb_gpuadvisor/xplane.proto", package=_PACKAGE, syntax="proto3")
    for name, fields, oneofs in _MESSAGES:
        msg = proto.message_type.add(name=name)
        _add_fields(msg, fields, oneofs)
        for entry_name, value_type in _MAP_ENTRIES.get(name, []):
            entry = msg.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            _add_fields(entry, [("key", 1, _INT64, _ONE, None, None),
                                ("value", 2, _MESSAGE, _ONE, value_type, None)], [])
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_build_file())


def _message_class(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


XSpace = _message_class("XSpace")
XPlane = _message_class("XPlane")
XLine = _message_class("XLine")
XEvent = _message_class("XEvent")
XStat = _message_class("XStat")
XEventMetadata = _message_class("XEventMetadata")
XStatMetadata = _message_class("XStatMetadata")
