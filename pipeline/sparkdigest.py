"""The state digest in Spark, computed exactly as the nodes compute it.

Each live (key, value) is hashed by raftlog.digest.pair_hash itself (a vectorised pandas UDF: the same
function the nodes run, so the same bytes give the same 128 bits), split into two signed 64-bit halves,
XOR-aggregated by Spark (`bit_xor`, order-independent like the digest), and joined again on the driver.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from raftlog.digest import digest_hex

HALVES = StructType([StructField("hi", LongType()), StructField("lo", LongType())])
_MASK64 = (1 << 64) - 1
_SIGN = 1 << 63


def _signed(v: int) -> int:
    return v - (1 << 64) if v & _SIGN else v


@F.pandas_udf(HALVES)  # type: ignore[call-overload]  # (pyspark's stubs lack a struct-returning scalar UDF)
def pair_hash_halves(key: pd.Series, value: pd.Series) -> pd.DataFrame:
    from raftlog.digest import pair_hash  # on the executor

    his: list[int] = []
    los: list[int] = []
    for k, v in zip(key, value, strict=True):
        h = pair_hash(k, bytes(v))
        his.append(_signed(h >> 64))
        los.append(_signed(h & _MASK64))
    return pd.DataFrame({"hi": pd.Series(his, dtype="int64"), "lo": pd.Series(los, dtype="int64")})


def hash_column(key: str = "key", value: str = "value") -> Column:
    return pair_hash_halves(F.col(key), F.col(value))


def combine(hi: int | None, lo: int | None) -> int:
    return (((hi or 0) & _MASK64) << 64) | ((lo or 0) & _MASK64)


def digest_of(df: DataFrame, key: str = "key", value: str = "value") -> tuple[str, int]:
    """(digest hex, number of pairs) of a DataFrame of live (key, value) pairs."""
    row = (df.select(hash_column(key, value).alias("h"))
           .agg(F.bit_xor("h.hi").alias("hi"), F.bit_xor("h.lo").alias("lo"), F.count(F.lit(1)).alias("n"))
           .first())
    assert row is not None
    return digest_hex(combine(row["hi"], row["lo"])), int(row["n"])
