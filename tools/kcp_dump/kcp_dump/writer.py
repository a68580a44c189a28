"""kcp_dump.writer: writes kcp-dump version 2 files (docs/DUMP_FORMAT.md) for `kcp check`; numpy and h5py only.

``write_dump(path, op, inputs, results, ...)`` writes inputs, flags and result groups, bf16 in any of
the three encodings kcp reads, narrowing float32 to bf16 with round-to-nearest-even (PyTorch's rule,
never HDF5's). The folder is created; the file appears atomically (temp + rename) with mode 0644.
Attribute values are converted to plain HDF5 types (str subclasses such as torch.__version__ to str,
numpy / torch scalars to Python numbers, None to NaN); anything else is an error naming the attribute.

Tested by tests/tools/test_kcp_dump.py and tests/tools/test_kcp_capture.py (through the kcp executable).
"""
import os
import tempfile

import h5py
import numpy as np

__all__ = ["write_dump", "bf16_bits_from_float32", "float32_from_bf16_bits", "bf16_float_type",
           "attr_value", "ENCODINGS", "FORMAT", "FORMAT_VERSION"]

FORMAT = "kcp-dump"
FORMAT_VERSION = 2
ENCODINGS = ("float32", "bf16_float", "bf16_bits")  # "float32" is the goldens' upcast form
OP_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "do", "dht")


# --- bfloat16 without torch ------------------------------------------------------------------------

def bf16_bits_from_float32(x):
    """Rounds float32 values to bfloat16 bit patterns, ties to even (torch's .to(torch.bfloat16))."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7F800000) == 0x7F800000
    nan &= (u & 0x007FFFFF) != 0
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet = (u >> 16) | 0x0040
    return np.where(nan, quiet, rounded).astype(np.uint16)


def float32_from_bf16_bits(bits):
    """Widens bfloat16 bit patterns to float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_float_type():
    """The 2-byte HDF5 float type of bfloat16: IEEE f32 with sign 15, exponent 7..14, mantissa 0..6, bias 127."""
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_size(2)
    t.set_ebias(127)
    return t


def _bf16_bits(name, a):
    """Bit patterns of a tensor declared bfloat16: uint16 bits as given, float values only if exact."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return a
    f = np.asarray(a, dtype=np.float32)
    if not np.array_equal(f, a) or np.any(f.view(np.uint32) & 0xFFFF):
        raise ValueError(f"{name}: declared bfloat16 but holds values that are not bfloat16; round them first "
                         f"with bf16_bits_from_float32() (ties to even), never let HDF5 narrow")
    return (f.view(np.uint32) >> 16).astype(np.uint16)


# --- the file-writing half ------------------------------------------------------------------------

def _write_dataset(group, name, array, source, encoding):
    """One dataset with attributes dtype and encoding; bf16 in the chosen encoding."""
    if source == "bfloat16":
        bits = _bf16_bits(f"{group.name}/{name}", array)
        if encoding == "float32":
            ds = group.create_dataset(name, data=float32_from_bf16_bits(bits))
            enc = "ieee"
        elif encoding == "bf16_float":  # low-level write: memory type == file type, so HDF5 never converts
            t = bf16_float_type()
            space = h5py.h5s.create_simple(bits.shape) if bits.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
            dsid = h5py.h5d.create(group.id, name.encode(), t, space)
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(bits), mtype=t)
            ds, enc = h5py.Dataset(dsid), "bf16_float"
        elif encoding == "bf16_bits":
            ds, enc = group.create_dataset(name, data=bits), "bf16_bits"
        else:
            raise ValueError(f"bf16 encoding must be one of {ENCODINGS}, got {encoding!r}")
    else:
        a = np.asarray(array)
        if source in ("float64", "float32", "float16", "int32", "int64"):
            a = a.astype(np.dtype(source), copy=False)
        ds, enc = group.create_dataset(name, data=a), "ieee"
    ds.attrs["dtype"] = source
    ds.attrs["encoding"] = enc
    return ds


def _source_dtype(key, array, dtypes):
    """The producer's dtype of a tensor: dtypes[key] or dtypes[name], else the numpy dtype's name."""
    name = key.split("/")[-1]
    for k in (key, name):
        if dtypes and k in dtypes:
            return str(dtypes[k]).replace("torch.", "")
    return "bfloat16" if np.asarray(array).dtype == np.uint16 else np.asarray(array).dtype.name


def attr_value(name, v):
    """An attribute value as a plain HDF5 type kcp reads: bool stays bool (h5py's enum), None becomes
    NaN, str subclasses (torch.__version__) become str, numpy / torch scalars become Python numbers,
    lists of strings become one comma-separated string. Anything else is an error naming the attribute."""
    if v is None:
        return float("nan")
    if isinstance(v, (np.generic, np.ndarray)) and np.ndim(v) == 0:
        v = v.item()
    elif type(v).__module__.startswith("torch") and callable(getattr(v, "numel", None)) and v.numel() == 1:
        v = v.item()
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, (str, np.str_)):
        return str(v)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return ", ".join(str(x) for x in v)
    raise TypeError(f"attribute {name}: cannot store a {type(v).__name__} ({v!r:.60}) as an HDF5 attribute; "
                    f"pass a bool, number, string or None")


def write_dump(path, op, inputs, results=None, attrs=None, dtypes=None, bf16_encoding="bf16_float",
               group_attrs=None, dataset_attrs=None):
    """Writes a kcp-dump v2 file atomically.

    op:       "gdn", "kda", "gla" or "conv1d".
    inputs:   name -> array for /inputs (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
              do, dht; for conv1d x, weight, bias, cu_seqlens, dy).
    results:  group -> name -> array (o, final_state, dq, ...), e.g. {"fla_chunk": {...}}.
    attrs:    root attributes: flags (bool), scale, chunk_size, lower_bound (None -> NaN), placement...
    dtypes:   name or "group/name" -> producer dtype ("bfloat16", "float32", ...); bf16 tensors are
              float32 arrays holding bf16 values or uint16 bit patterns.
    dataset_attrs: "group/name" -> {attribute: value}, e.g. {"inputs/cu_seqlens": {"scope": "global"}}.
    """
    if op not in ("gdn", "kda", "gla", "conv1d"):
        raise ValueError(f"unknown op {op!r} (expected gdn, kda, gla or conv1d)")
    if bf16_encoding not in ENCODINGS:
        raise ValueError(f"bf16_encoding must be one of {ENCODINGS}")
    root = {"format": FORMAT, "format_version": FORMAT_VERSION, "op": op, "layout": "BTHD"}
    first = "x" if op == "conv1d" else "q"
    if first in inputs:
        root["input_dtype"] = _source_dtype(f"inputs/{first}", inputs[first], dtypes)
    root.update(attrs or {})
    root["format"], root["format_version"] = FORMAT, FORMAT_VERSION
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in root.items():
                f.attrs[k] = attr_value(k, v)
            groups = {"inputs": inputs}
            groups.update(results or {})
            for gname, tensors in groups.items():
                g = f.create_group(gname)
                for k, v in ((group_attrs or {}).get(gname) or {}).items():
                    g.attrs[k] = attr_value(f"{gname}:{k}", v)
                for name, array in tensors.items():
                    if array is None:
                        continue
                    src = _source_dtype(f"{gname}/{name}", array, dtypes)
                    if name.startswith("cu_seqlens"):
                        src = "int64"
                    ds = _write_dataset(g, name, array, src, bf16_encoding)
                    for k, v in ((dataset_attrs or {}).get(f"{gname}/{name}") or {}).items():
                        ds.attrs[k] = attr_value(f"{gname}/{name}:{k}", v)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a dump is meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
