"""The report labeler: each observation of a radiology report text as positive, negative,
uncertain or not mentioned, with the sentence that decided it (CheXpert labeler semantics on a
blank spaCy pipeline and negspacy's NegEx)."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import spacy
from negspacy.negation import Negex  # noqa: F401  (registers the "negex" factory)
from negspacy.termsets import termset
from spacy.language import Language
from spacy.matcher import PhraseMatcher
from spacy.tokens import Doc, Span
from spacy.util import filter_spans

from radharmony_pipeline.processing.reports import phrases
from radharmony_pipeline.processing.reports.sections import read_text, sentence_pieces
from radharmony_pipeline.vocabulary import REPORT_OBSERVATIONS

NO_FINDING = "no_finding"
# Observations whose presence leaves "no finding" standing (as in CheXpert).
_COMPATIBLE_WITH_NO_FINDING = frozenset({"support_devices", NO_FINDING})


POSITIVE, NEGATIVE, UNCERTAIN = 1, 0, -1
# Several mentions of one observation: positive over uncertain over negative.
_PRECEDENCE = {POSITIVE: 2, UNCERTAIN: 1, NEGATIVE: 0}

_MENTIONS_COMPONENT = "radharmony_report_mentions"
_TRIGGERS = "radharmony_report_triggers"
# Kinds of phrase the one mention matcher finds besides mentions.
_UNCERTAIN_BEFORE = "uncertain_before"
_UNCERTAIN_AFTER = "uncertain_after"
_UNCERTAIN_AFTER_NEAREST = "uncertain_after_nearest"
_ALTERNATIVE = "alternative"
_CLAUSE_END = "clause_end"
_NEGATION_BEFORE = "negation_before"
_ENLARGED = "enlarged"
_NORMAL_SIZE = "normal_size"
_NOT_UNCERTAIN = "not_uncertain"
_ATTRIBUTION = "attribution"
_ARTIFACT = "artifact"
_DEVICE_PART = "device_part"
_IGNORED = "ignored"
# Subjects named through their size, and what their enlargement and normal size state.
_SIZE_SUBJECTS: dict[str, tuple[tuple[str, ...], tuple[str, tuple[str, ...]]]] = {
    "heart": (phrases.HEART_SUBJECTS, ("cardiomegaly", ("cardiomegaly",))),
    "mediastinum": (
        phrases.MEDIASTINUM_SUBJECTS,
        ("enlarged_cardiomediastinum", ("enlarged_cardiomediastinum",)),
    ),
    "cardiomediastinum": (
        phrases.CARDIOMEDIASTINAL_SUBJECTS,
        ("enlarged_cardiomediastinum", ("enlarged_cardiomediastinum", "cardiomegaly")),
    ),
}
# Tokens between two sizes of a range ("normal to mildly enlarged").
_RANGE_GAP = 2
_NEGATION_WORDS = frozenset({"no", "not", "cannot", "can't", "without"})
_WORD = re.compile(r"[^\W\d_]+")
# Pieces kept between calls: reports repeat their sentences far more than their texts.
_PIECE_CACHE_LIMIT = 500_000
_BATCH_SIZE = 512
_TEXTS_PER_CHUNK = 20_000


@dataclass(frozen=True)
class Evidence:
    """The sentence that decided one positive or uncertain label."""

    observation: str
    value: int
    sentence: str


@dataclass(frozen=True)
class ReportReading:
    """One report's labels (1, 0, -1 or None per observation) and their evidence."""

    labels: Mapping[str, int | None]
    evidence: tuple[Evidence, ...]
    mentioned: bool


# (observation, value, sentence) for each mention in one piece of text.
_PieceFindings = tuple[tuple[str, int, str], ...]


def negation_termset() -> dict[str, list[str]]:
    """negspacy's clinical termset as the library ships it, without the terms that mean
    something else in a chest X-ray report and with the report phrases of `phrases`."""
    shipped = termset("en_clinical").get_patterns()
    dropped = set(phrases.NEGSPACY_TERMS_DROPPED)
    terms = {key: [t for t in values if t not in dropped] for key, values in shipped.items()}
    uncertain = phrases.UNCERTAIN_BEFORE + phrases.UNCERTAIN_AFTER
    # An uncertainty phrase with a negation word in it ("cannot exclude") denies nothing.
    negated_uncertainty = [p for p in uncertain if _NEGATION_WORDS.intersection(p.split())]
    additions = {
        "pseudo_negations": [*phrases.NOT_NEGATION, *negated_uncertainty],
        "preceding_negations": list(phrases.NEGATION_BEFORE),
        "following_negations": list(phrases.NEGATION_AFTER),
        "termination": list(phrases.CLAUSE_ENDS),
    }
    return {key: sorted(set(terms[key]) | set(additions[key])) for key in terms}


def _mention_labels() -> dict[str, tuple[str, ...]]:
    """Phrase -> observations it names, every phrase once."""
    by_phrase: dict[str, tuple[str, ...]] = {}
    for observations, names in phrases.MENTIONS.items():
        unknown = set(observations) - set(REPORT_OBSERVATIONS)
        if unknown:
            raise ValueError(f"phrases.MENTIONS names unknown observations {sorted(unknown)}")
        for name in names:
            if name in by_phrase:
                raise ValueError(f"phrase {name!r} is listed twice in phrases.MENTIONS")
            by_phrase[name] = observations
    return by_phrase


class _MentionFinder:
    """Pipeline component: one phrase-matcher pass that sets the mentions as `doc.ents` (label
    = the observations it names, joined by '+') and keeps the uncertainty and clause words."""

    def __init__(self, nlp: Language, clause_ends: list[str], negations_before: list[str]):
        self.matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
        strings = nlp.vocab.strings
        self.kind: dict[int, str] = {}

        def add(key: str, kind: str, texts: Iterable[str]) -> None:
            self.matcher.add(key, list(nlp.tokenizer.pipe(texts)))
            self.kind[strings.add(key)] = kind

        by_observations: dict[tuple[str, ...], list[str]] = {}
        for phrase, observations in _mention_labels().items():
            by_observations.setdefault(observations, []).append(phrase)
        for observations, texts in by_observations.items():
            key = "+".join(observations) if observations else _IGNORED
            add(key, "mention" if observations else _IGNORED, texts)
        for subject, (texts, _) in _SIZE_SUBJECTS.items():
            add(f"subject:{subject}", "subject", texts)
        add(_ENLARGED, _ENLARGED, phrases.ENLARGED)
        add(_NORMAL_SIZE, _NORMAL_SIZE, phrases.NORMAL_SIZE)
        add(_UNCERTAIN_BEFORE, _UNCERTAIN_BEFORE, phrases.UNCERTAIN_BEFORE)
        add(_UNCERTAIN_AFTER, _UNCERTAIN_AFTER, phrases.UNCERTAIN_AFTER)
        add(_UNCERTAIN_AFTER_NEAREST, _UNCERTAIN_AFTER_NEAREST, phrases.UNCERTAIN_AFTER_NEAREST)
        add(_ALTERNATIVE, _ALTERNATIVE, phrases.ALTERNATIVES)
        add(_CLAUSE_END, _CLAUSE_END, clause_ends)
        add(_NEGATION_BEFORE, _NEGATION_BEFORE, negations_before)
        add(_NOT_UNCERTAIN, _NOT_UNCERTAIN, phrases.NOT_UNCERTAIN)
        add(_ATTRIBUTION, _ATTRIBUTION, phrases.ATTRIBUTIONS)
        add(_ARTIFACT, _ARTIFACT, phrases.ARTIFACT_CAUSES)
        add(_DEVICE_PART, _DEVICE_PART, phrases.DEVICE_PARTS)

    def __call__(self, doc: Doc) -> Doc:
        found: dict[str, list[Span]] = {}
        strings = doc.vocab.strings
        for match_id, start, end in self.matcher(doc):
            kind = self.kind[match_id]
            found.setdefault(kind, []).append(Span(doc, start, end, label=strings[match_id]))
        mentions = found.get("mention", []) + found.get(_IGNORED, [])
        if "subject" in found:
            mentions += _size_mentions(doc, found)
        doc.ents = [span for span in filter_spans(mentions) if span.label_ != _IGNORED]
        doc.user_data[_TRIGGERS] = found
        return doc


def _size_mentions(doc: Doc, found: dict[str, list[Span]]) -> list[Span]:
    """Heart and mediastinum subjects joined to the size attribute nearest them in their
    sentence: label `size:<observation>` when enlarged, `normal:<observations>` when normal,
    `borderline:<observation>` when described as both."""
    attributes = filter_spans(found.get(_ENLARGED, []) + found.get(_NORMAL_SIZE, []))
    ends = sorted(span.start for span in found.get(_CLAUSE_END, []))
    sizes = []
    for subject in found["subject"]:
        near = [
            a
            for a in attributes
            if _gap(subject, a) <= phrases.ATTRIBUTE_REACH
            and a.sent.start == subject.sent.start
            and not _clause_end_between(ends, subject, a)
        ]
        if not near:
            continue
        attribute = min(near, key=lambda a: _gap(subject, a))
        # "upper limits of normal to mildly enlarged": an attribute of the other kind right
        # after the nearest one makes the size borderline.
        other = [
            a
            for a in attributes
            if a.label_ != attribute.label_ and 0 <= a.start - attribute.end <= _RANGE_GAP
        ]
        enlarged, normal = _SIZE_SUBJECTS[subject.label_.removeprefix("subject:")][1]
        if other:
            label = f"borderline:{enlarged}"
            attribute = Span(doc, attribute.start, other[0].end)
        elif attribute.label_ == _ENLARGED:
            label = f"size:{enlarged}"
        else:
            label = f"normal:{'+'.join(normal)}"
        start, end = min(subject.start, attribute.start), max(subject.end, attribute.end)
        sizes.append(Span(doc, start, end, label=label))
    return sizes


def _gap(a: Span, b: Span) -> int:
    return max(b.start - a.end, a.start - b.end, 0)


def _clause_end_between(ends: list[int], a: Span, b: Span) -> bool:
    low, high = min(a.end, b.end), max(a.start, b.start)
    index = bisect_right(ends, low - 1)
    return index < len(ends) and ends[index] < high


@Language.factory(_MENTIONS_COMPONENT, default_config={"clause_ends": [], "negations_before": []})
def _make_mention_finder(
    nlp: Language, name: str, clause_ends: list[str], negations_before: list[str]
) -> _MentionFinder:
    return _MentionFinder(nlp, clause_ends, negations_before)


def _observations_of(label: str) -> tuple[tuple[str, ...], int | None]:
    """A mention label -> (observations, value fixed by the phrase or None)."""
    if label.startswith("normal:"):
        return tuple(label.removeprefix("normal:").split("+")), NEGATIVE
    if label.startswith("borderline:"):
        return tuple(label.removeprefix("borderline:").split("+")), UNCERTAIN
    return tuple(label.removeprefix("size:").split("+")), None


def _sentence_spans(doc: Doc) -> tuple[list[int], list[str]]:
    """The start token and the text of each sentence."""
    sentences = list(doc.sents)
    if len(sentences) == 1:
        return [0], [doc.text.strip()]
    return [s.start for s in sentences], [s.text for s in sentences]


def _piece_findings(doc: Doc) -> _PieceFindings:
    """Each mention of one piece as (observation, value, sentence)."""
    if not doc.ents:
        return ()
    found: dict[str, list[Span]] = doc.user_data[_TRIGGERS]
    sentence_starts, sentences = _sentence_spans(doc)
    starts = sorted({*sentence_starts, *(span.start for span in found.get(_CLAUSE_END, []))})

    def clause(token: int) -> int:
        return bisect_right(starts, token)

    neutral = found.get(_NOT_UNCERTAIN, [])
    before = _outside(found.get(_UNCERTAIN_BEFORE, []), neutral)
    after = _outside(found.get(_UNCERTAIN_AFTER, []), neutral)
    negations = found.get(_NEGATION_BEFORE, [])
    part_ends = {span.end for span in found.get(_DEVICE_PART, [])}
    ents = list(doc.ents)
    alternative = _alternatives(ents, found.get(_ALTERNATIVE, []), clause)
    alternative |= _nearest_before(ents, found.get(_UNCERTAIN_AFTER_NEAREST, []), clause)
    explained = _explained_away(ents, found, clause)
    findings = []
    for index, ent in enumerate(ents):
        observations, fixed = _observations_of(ent.label_)
        own = clause(ent.start)
        cues_before = [t for t in before if t.start < ent.end and clause(t.start) == own]
        uncertain = (
            index in alternative
            or index in explained
            or bool(cues_before)
            or any(t.start >= ent.end and clause(t.start) == own for t in after)
        )
        negated = (
            ent._.negex
            and ent.start not in part_ends
            and not _uncertainty_nearer(ent, cues_before, negations, ents, clause)
        )
        if fixed is not None:
            value = fixed
        elif negated:
            value = NEGATIVE
        else:
            value = UNCERTAIN if uncertain else POSITIVE
        sentence = sentences[bisect_right(sentence_starts, ent.start) - 1]
        findings.extend((name, value, sentence) for name in observations)
    return tuple(findings)


def _outside(cues: list[Span], neutral: list[Span]) -> list[Span]:
    """The cues that are not part of a phrase that takes their doubt away."""
    if not neutral:
        return cues
    return [c for c in cues if not any(n.start <= c.start < n.end for n in neutral)]


def _explained_away(ents: list[Span], found: dict[str, list[Span]], clause) -> set[int]:
    """Indexes of mentions that their clause attributes to technique or overlying tissue."""
    links = found.get(_ATTRIBUTION, [])
    causes = found.get(_ARTIFACT, [])
    if not links or not causes:
        return set()
    return {
        i
        for i, e in enumerate(ents)
        if any(
            e.end <= link.start < cause.start
            and clause(link.start) == clause(e.start) == clause(cause.start)
            for link in links
            for cause in causes
        )
    }


def _alternatives(ents: list[Span], words: list[Span], clause) -> set[int]:
    """Indexes of mentions on either side of "or" / "versus" close to both."""
    uncertain: set[int] = set()
    reach = phrases.ALTERNATIVE_REACH
    for word in words:
        left = [
            i
            for i, e in enumerate(ents)
            if e.end <= word.start
            and word.start - e.end <= reach
            and clause(e.start) == clause(word.start)
        ]
        right = [
            i
            for i, e in enumerate(ents)
            if e.start >= word.end
            and e.start - word.end <= reach
            and clause(e.start) == clause(word.start)
        ]
        if left and right:
            uncertain.update((left[-1], right[0]))
    return uncertain


def _nearest_before(ents: list[Span], words: list[Span], clause) -> set[int]:
    """Indexes of the mention right before each word (in its clause)."""
    nearest = set()
    for word in words:
        before = [
            i
            for i, e in enumerate(ents)
            if e.end <= word.start and clause(e.start) == clause(word.start)
        ]
        if before:
            nearest.add(before[-1])
    return nearest


def _uncertainty_nearer(
    ent: Span, cues: list[Span], negations: list[Span], ents: list[Span], clause
) -> bool:
    """An uncertainty cue that follows another mention after the nearest negation cue wins over
    the negation ("no effusion, possible pneumothorax" leaves the pneumothorax uncertain; "no
    suspicious nodules" stays negative)."""
    if not cues:
        return False
    own = clause(ent.start)
    preceding = [n.start for n in negations if n.start < ent.start and clause(n.start) == own]
    if not preceding:
        return False
    negation, cue = max(preceding), max(c.start for c in cues)
    return cue > negation and any(negation < e.start and e.end <= cue for e in ents)


class ReportLabeler:
    """Reads report texts: the findings and impression sections (or the whole text without
    headers), each observation mentioned, negated or made uncertain inside its clause."""

    def __init__(self) -> None:
        negation_terms = negation_termset()
        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("sentencizer")
        self.nlp.add_pipe(
            _MENTIONS_COMPONENT,
            config={
                "clause_ends": negation_terms["termination"],
                "negations_before": negation_terms["preceding_negations"],
            },
        )
        self.nlp.add_pipe("negex", config={"neg_termset": negation_terms})
        # A piece without any of these words mentions nothing and skips the pipeline.
        self._mention_words = frozenset(_mention_words(self.nlp))
        self._pieces: dict[str, _PieceFindings] = {}

    def read(self, text: str | None) -> ReportReading:
        """One report text's reading (every label None for no text)."""
        return self.read_many([text])[0]

    def read_many(self, texts: Iterable[str | None]) -> list[ReportReading]:
        """Readings in the order of `texts`; identical texts and sentences are read once."""
        texts = list(texts)
        distinct = list(dict.fromkeys(t for t in texts if isinstance(t, str)))
        readings: dict[str, ReportReading] = {}
        # In chunks, so a partition's sentence pieces are never all held at once.
        for first in range(0, len(distinct), _TEXTS_PER_CHUNK):
            chunk = distinct[first : first + _TEXTS_PER_CHUNK]
            pieces_of = [_pieces_read(text) for text in chunk]
            self._read_pieces([p for pieces in pieces_of if pieces for p in pieces])
            for text, pieces in zip(chunk, pieces_of, strict=True):
                found = None if pieces is None else [self._pieces[p] for p in pieces]
                readings[text] = _reading(found)
        return [readings[t] if isinstance(t, str) else _UNREAD for t in texts]

    def _read_pieces(self, pieces: list[str]) -> None:
        """Find the mentions of every piece not read before."""
        if len(self._pieces) > _PIECE_CACHE_LIMIT:
            self._pieces.clear()
        new = []
        for piece in pieces:
            if piece not in self._pieces:
                self._pieces[piece] = ()  # stays empty when no mention word is in the piece
                if not self._mention_words.isdisjoint(_WORD.findall(piece.lower())):
                    new.append(piece)
        for piece, doc in zip(new, self.nlp.pipe(new, batch_size=_BATCH_SIZE), strict=True):
            self._pieces[piece] = _piece_findings(doc)


def _pieces_read(text: str) -> list[str] | None:
    """The sentence pieces of a report's read sections; None when nothing is read."""
    read = read_text(text)
    return sentence_pieces(read) if read is not None and read.strip() else None


def _mention_words(nlp: Language) -> set[str]:
    """The longest word of every mention and subject phrase: a piece matching a phrase holds
    that word."""
    texts = [*_mention_labels(), *(t for texts, _ in _SIZE_SUBJECTS.values() for t in texts)]
    words = set()
    for doc in nlp.tokenizer.pipe(texts):
        alphabetic = [token.lower_ for token in doc if token.is_alpha]
        if not alphabetic:
            raise ValueError(f"mention phrase {doc.text!r} has no word to pre-filter on")
        words.add(max(alphabetic, key=len))
    return words


def _reading(pieces: list[_PieceFindings] | None) -> ReportReading:
    """Aggregate a report's piece findings into its labels and evidence."""
    if pieces is None:
        return _UNREAD
    labels: dict[str, int | None] = dict.fromkeys(REPORT_OBSERVATIONS)
    sentences: dict[str, str] = {}
    for findings in pieces:
        for observation, value, sentence in findings:
            current = labels[observation]
            if current is None or _PRECEDENCE[value] > _PRECEDENCE[current]:
                labels[observation] = value
                sentences[observation] = sentence
    mentioned = any(value is not None for value in labels.values())
    if not any(
        value in (POSITIVE, UNCERTAIN)
        for name, value in labels.items()
        if name not in _COMPATIBLE_WITH_NO_FINDING
    ):
        labels[NO_FINDING] = POSITIVE
    evidence = tuple(
        Evidence(name, value, sentences[name])
        for name, value in labels.items()
        if value in (POSITIVE, UNCERTAIN) and name != NO_FINDING
    )
    return ReportReading(MappingProxyType(labels), evidence, mentioned)


_UNREAD = ReportReading(MappingProxyType(dict.fromkeys(REPORT_OBSERVATIONS)), (), False)
