"""Options declared once: a frozen dataclass whose fields are made with :func:`option` is a command line. Every
``interp`` command and every study declares its options this way (:mod:`interp.commands.inputs`,
:mod:`interp.studies.declaration`); the parser, ``--help``, the parse-time checks (:mod:`interp.values`) and the
values handed to the work all come from the one declaration. Torch-free: ``interp --help`` reads them all.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, kw_only=True)
... class Greeting(Options):
...     name: str = option("world", "who to greet")
...     times: int = option(1, "how often", parse=int)
>>> parser = argparse.ArgumentParser()
>>> Greeting.add_arguments(parser)
>>> Greeting.from_args(parser.parse_args(["--times", "2"]))
Greeting(name='world', times=2)
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

from .errors import UsageError


@dataclass(frozen=True)
class Flag:
    """How one field appears on the command line (kept in the field's ``metadata["flag"]``).

    Attributes:
        help: the help text.
        flag: the option (default ``--`` + the field name with dashes).
        aliases: other names of the same option (a short ``-q``; a former name with the same meaning).
        parse: ``text -> value``, raising ``argparse.ArgumentTypeError`` (:mod:`interp.values`); default from
            the field's type (``int``, ``float``, ``str``).
        choices: the accepted values.
        many: one or more values (``nargs="+"``; the field holds a tuple); ``"*"``: zero or more.
        metavar: the value's name in ``--help``.
        required: the command line must give it.
        off: for a boolean that defaults to True: the flag that turns it off (``--no-selective``); with
            ``flag`` given too, both (``--pretrained`` / ``--no-pretrained``, ``off_help`` the second's help).
        group: the ``--help`` section it is listed under.
        positional: a positional argument (``MODEL``); with a default, it may be left out.
        exclusive: the name of a mutually exclusive group (``--images`` / ``--cache``); the class attribute
            ``REQUIRED_GROUPS`` names the groups of which one must be given.
    """

    help: str
    flag: Optional[str] = None
    aliases: Tuple[str, ...] = ()
    parse: Optional[Callable[[str], Any]] = None
    choices: Optional[Tuple[Any, ...]] = None
    many: Any = False
    metavar: Optional[str] = None
    required: bool = False
    off: Optional[str] = None
    off_help: Optional[str] = None
    group: Optional[str] = None
    positional: bool = False
    exclusive: Optional[str] = None


def option(default: Any, help: str, **flag: Any) -> Any:
    """A field with its command-line form: ``threshold: Optional[str] = option(None, "...", parse=...)``
    (keyword arguments: :class:`Flag`'s)."""
    return dataclasses.field(default=default, metadata={"flag": Flag(help=help, **flag)})


def group(cls: type, **defaults: Any) -> Any:
    """A field holding an option group (an :class:`Options` class): the command line lists the group's fields
    where this field is declared, each under its own name; ``defaults``: this command's defaults of some of
    them (``group(BatchOptions, batch_size=8)``). Python callers pass the group built:
    ``ReportOptions(detection=DetectionSpec(threshold=3.5))``, or its options flat to :meth:`Options.build`."""
    return dataclasses.field(default_factory=functools.partial(cls, **defaults),
                             metadata={"group": cls, "defaults": dict(defaults)})


def base_type(hint: Any) -> Any:
    """``Optional[int]`` -> ``int``; ``Tuple[float, ...]`` -> ``float``; other hints unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, tuple) and args:
        return base_type(args[0])
    return hint


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> Dict[str, Any]:
    """The resolved annotations of an options class (evaluating them compiles every annotation string: read
    once per class, not at every parser build)."""
    return typing.get_type_hints(cls)


def _names(cls: type) -> Tuple[List[Tuple[str, Optional[str]]], List[Tuple[str, Optional[str]]]]:
    """The (name, home) pairs of an options class's option fields and of its group fields, its groups' included
    (transitively); home: the group field of ``cls`` that holds the name (None: a field of ``cls``)."""
    leaves: List[Tuple[str, Optional[str]]] = []
    groups: List[Tuple[str, Optional[str]]] = []
    for f in dataclasses.fields(cls):
        if "group" in f.metadata:
            inner_leaves, inner_groups = _names(f.metadata["group"])
            leaves += [(name, f.name) for name, _ in inner_leaves]
            groups += [(f.name, None)] + [(name, f.name) for name, _ in inner_groups]
        else:
            leaves.append((f.name, None))
    return leaves, groups


@functools.lru_cache(maxsize=None)
def _keyword_homes(cls: type) -> Dict[str, Optional[str]]:
    """:meth:`Options.keyword_homes`, read once per class."""
    leaves, groups = _names(cls)
    homes = dict(leaves)
    if len(homes) != len(leaves):
        twice = next(name for i, (name, _) in enumerate(leaves) if name in dict(leaves[:i]))
        raise TypeError(f"{cls.__name__} declares {twice!r} twice (the fields of a class and of its groups are one "
                        "namespace: the command line's)")
    counts = collections.Counter(name for name, _ in groups)
    homes.update((name, home) for name, home in groups if counts[name] == 1 and name not in homes)
    return homes


class Renamed(argparse.Action):
    """A former option name: giving it is a one-line error (exit 2) that names the option to use now. Declared
    as an option of its own, so that argparse never reads the old name as an abbreviation of another."""

    def __init__(self, option_strings, dest, message: str = "", **kwargs):
        kwargs.update(nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest=argparse.SUPPRESS, **kwargs)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} was {self.message}")


@dataclass(frozen=True, kw_only=True)
class Options:
    """Options declared with :func:`option` (subclass it as a frozen, keyword-only dataclass; hold option groups
    as fields made with :func:`group`). Building one checks it: each value among its ``choices``, then
    :meth:`check`; a group is checked when it is built. ``--help`` lists the options in declaration order.

    Class attributes:
        RENAMED: ``{former flag: what it became}``; the former flag is refused in one line that says it.
        REQUIRED_GROUPS: the :attr:`Flag.exclusive` groups of which one option must be given.
    """

    RENAMED: ClassVar[Dict[str, str]] = {}
    REQUIRED_GROUPS: ClassVar[Tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        self.check_choices()
        self.check()

    def check(self) -> None:
        """Refuse option values that cannot go together (a :class:`~interp.errors.UsageError`); torch-free."""

    def check_choices(self) -> None:
        """Every option given one of its declared ``choices`` (None: not given), for Python callers as the
        command line's parser does."""
        for f in self.cli_fields():
            choices, value = f.metadata["flag"].choices, getattr(self, f.name)
            values = value if f.metadata["flag"].many and isinstance(value, (list, tuple)) else [value]
            bad = [v for v in values if v is not None and choices is not None and v not in choices]
            if bad:
                raise UsageError(f"{f.name}={bad[0]!r}: use one of {list(choices)}")

    def to_dict(self) -> Dict[str, Any]:
        """The fields as JSON values (a group as its own dict)."""
        return {f.name: (v.to_dict() if isinstance(v, Options) else list(v) if isinstance(v, tuple) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}

    def with_options(self, **options: Any) -> "Options":
        """A copy with some options changed (checked again); keywords as :meth:`build` takes them, a group's
        options changed in this object's group."""
        return dataclasses.replace(self, **self._nested(options, self))

    # ------------------------------------------------------------------ flat keywords
    @classmethod
    def build(cls, **values: Any) -> "Options":
        """One built from flat keywords, as the command line gives them: a keyword that names a field of one of
        its groups (at any depth) goes into that group, the rest default (``PiBConfig.build(boxes="b.csv",
        n_boot=200)``); a group may also be given whole, under its field's name (``bootstrap=Bootstrap(...)``)."""
        return cls(**cls._nested(values))

    @classmethod
    def keyword_homes(cls) -> Dict[str, Optional[str]]:
        """Every keyword :meth:`build` takes: the name of each field, its groups' fields' included (transitively),
        mapped to the group field of this class that holds it (None: a field of this class). An option field
        declared twice is a TypeError: a command's options are one namespace (argparse's destinations). A group
        is a keyword when its name is no option's and no other group's (``seed: SeedOption`` holding ``seed``:
        ``seed=`` is the option; the group whole goes to the constructor)."""
        return _keyword_homes(cls)

    @classmethod
    def _nested(cls, values: Dict[str, Any], current: Optional["Options"] = None) -> Dict[str, Any]:
        """``values`` (flat keywords) as this class's fields: a group's keywords made into the group, built on
        ``current``'s group (else the field's default group). An unknown name, or a group given whole with some
        of its options too, is a TypeError."""
        homes = cls.keyword_homes()
        unknown = [k for k in values if k not in homes]
        if unknown:
            raise TypeError(f"{cls.__name__} has no option {unknown[0]!r} (its options: {', '.join(homes)})")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        own = {k: v for k, v in values.items() if homes[k] is None}
        loose: Dict[str, Dict[str, Any]] = {}
        for k, v in values.items():
            if homes[k] is not None:
                loose.setdefault(homes[k], {})[k] = v
        for name, options in loose.items():
            if name in own:
                raise TypeError(f"{cls.__name__}: give {name}= or its options ({', '.join(options)}=), not both")
            start = getattr(current, name) if current is not None else fields[name].default_factory()
            own[name] = start.with_options(**options)
        return own

    def parts(self) -> List["Options"]:
        """This object and the option groups it holds, transitively, in declaration order."""
        return [self] + [p for f in self.group_fields() for p in getattr(self, f.name).parts()]

    def values(self) -> Dict[str, Any]:
        """Every option's value by field name, the groups' included (a command's names are unique: they are its
        flags' destinations)."""
        return {f.name: getattr(part, f.name) for part in self.parts() for f in part.cli_fields()}

    # ------------------------------------------------------------------ command line
    @classmethod
    def option_fields(cls) -> List[dataclasses.Field]:
        """The fields that are options, the groups' included, transitively (one per command-line option)."""
        return [o for f in dataclasses.fields(cls)
                for o in ([f] if "flag" in f.metadata else
                          f.metadata["group"].option_fields() if "group" in f.metadata else [])]

    @classmethod
    def cli_fields(cls) -> List[dataclasses.Field]:
        """The fields that are options of their own (not groups)."""
        return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]

    @classmethod
    def group_fields(cls) -> List[dataclasses.Field]:
        """The fields that hold an option group (:func:`group`)."""
        return [f for f in dataclasses.fields(cls) if "group" in f.metadata]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, only: Optional[Sequence[str]] = None,
                      help: Optional[Dict[str, str]] = None, required_groups: Optional[Sequence[str]] = None,
                      defaults: Optional[Dict[str, Any]] = None) -> None:
        """Add one argument per field, in declaration order (a :func:`group` field: its group's arguments there;
        sections by :attr:`Flag.group`, :attr:`Flag.exclusive`), and the :attr:`RENAMED` flags. ``only``: just
        these fields; ``help``: other help texts by field name (groups included); ``required_groups``: instead
        of :attr:`REQUIRED_GROUPS`; ``defaults``: other defaults by field name (a :func:`group`'s)."""
        hints = _field_types(cls)
        required = cls.REQUIRED_GROUPS if required_groups is None else tuple(required_groups)
        sections: Dict[str, Any] = {}
        exclusive: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if "group" in f.metadata:
                if only is None:
                    f.metadata["group"].add_arguments(parser, help=help, defaults=f.metadata["defaults"])
                continue
            if "flag" not in f.metadata or (only is not None and f.name not in only):
                continue
            default = (defaults or {}).get(f.name, f.default)
            spec: Flag = f.metadata["flag"]
            target = parser if spec.group is None else sections.setdefault(
                spec.group, parser.add_argument_group(spec.group))
            if spec.exclusive is not None:
                if spec.exclusive not in exclusive:
                    exclusive[spec.exclusive] = target.add_mutually_exclusive_group(
                        required=spec.exclusive in required)
                target = exclusive[spec.exclusive]
            text = (help or {}).get(f.name, spec.help)
            flag = spec.flag or "--" + f.name.replace("_", "-")
            kind = base_type(hints[f.name])
            if kind is bool and not spec.positional:
                if spec.off and spec.flag:
                    target.add_argument(spec.flag, dest=f.name, action="store_true", default=default, help=text)
                    target.add_argument(spec.off, *spec.aliases, dest=f.name, action="store_false",
                                        help=spec.off_help)
                elif spec.off:
                    target.add_argument(spec.off, *spec.aliases, dest=f.name, action="store_false",
                                        default=default, help=text)
                else:
                    target.add_argument(flag, *spec.aliases, dest=f.name, action="store_true", default=default,
                                        help=text)
                continue
            kwargs: Dict[str, Any] = dict(help=text, type=spec.parse or (kind if kind in (int, float) else str))
            kwargs["default"] = list(default) if isinstance(default, tuple) else default
            if spec.choices is not None:
                kwargs["choices"] = spec.choices
            if spec.many:
                kwargs["nargs"] = spec.many if isinstance(spec.many, str) else "+"
            if spec.metavar:
                kwargs["metavar"] = spec.metavar
            if spec.positional:
                if default is not None or not spec.required:
                    kwargs.setdefault("nargs", "?")
                target.add_argument(f.name, **kwargs)
            else:
                target.add_argument(flag, *spec.aliases, dest=f.name, required=spec.required, **kwargs)
        if only is None:
            for old, message in cls.RENAMED.items():
                parser.add_argument(old, action=Renamed, message=message)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Options":
        """The options of parsed command-line ``args`` (checked); fields without a command-line form keep
        their defaults."""
        values: Dict[str, Any] = {f.name: f.metadata["group"].from_args(args) for f in cls.group_fields()}
        for f in cls.cli_fields():
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)
