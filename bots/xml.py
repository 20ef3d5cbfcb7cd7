"""Safe XML for untrusted callbacks: defusedxml refuses entities, DTDs and external references."""

from __future__ import annotations

from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from bots.base import CallbackRejected


def parse_flat_xml(data: bytes | str) -> dict[str, str]:
    """`<xml><A>1</A><B><![CDATA[x]]></B></xml>` → {"A": "1", "B": "x"}; top-level children only.

    An XML bomb, a DTD or malformed XML becomes a CallbackRejected(400), never an expansion.
    """
    try:
        root: Element = fromstring(data, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise CallbackRejected("xml_forbidden", 400, "XML with DTD or entities is refused") from exc
    except (ParseError, ValueError, LookupError) as exc:  # LookupError: an encoding="…" Python has no codec for
        raise CallbackRejected("malformed_xml", 400, "body is not well-formed XML") from exc
    return {child.tag: (child.text or "") for child in root}
