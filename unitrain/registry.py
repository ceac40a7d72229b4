"""Named registries whose lookup errors list what is available."""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

from unitrain.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T | None = None):
        """Register ``item`` under ``name``; without ``item``, return a decorator."""
        if item is not None:
            self._items[name] = item
            return item

        def decorator(obj: T) -> T:
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._items) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
