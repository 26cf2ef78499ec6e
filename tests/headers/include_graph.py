"""The include graph of cohort's headers, read from their #include lines (every #include,
whatever the #if around it: a layer rule holds for every configuration)."""
import pathlib
import re

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


class IncludeGraph:
    def __init__(self, root):
        self.root = pathlib.Path(root)
        self._edges = {}

    def includes(self, header):
        """The headers `header` (relative to the root) names; only cohort's are followed."""
        if header not in self._edges:
            path = self.root / header
            text = path.read_text() if header.startswith("cohort/") and path.is_file() else ""
            self._edges[header] = INCLUDE.findall(text)
        return self._edges[header]

    def chain_to(self, start, wanted):
        """The first include chain from `start` to a header for which wanted(h) holds, or None
        (breadth first, so the chain is a shortest one)."""
        parent = {start: None}
        queue = [start]
        while queue:
            h = queue.pop(0)
            for n in self.includes(h):
                if n in parent:
                    continue
                parent[n] = h
                if wanted(n):
                    chain = [n]
                    while parent[chain[-1]] is not None:
                        chain.append(parent[chain[-1]])
                    return list(reversed(chain))
                queue.append(n)
        return None
