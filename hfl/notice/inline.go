package notice

import "github.com/dyadfs/dyadfs/hfl"

// inlineFits reports whether rec carries no bytes, or exactly its size of
// them within InlineMax.
func inlineFits(rec hfl.Record) bool {
	return rec.Inline == nil || (rec.Size <= hfl.InlineMax && int64(len(rec.Inline.Data)) == rec.Size)
}

// maxHeldBytes bounds the bytes of small files a home keeps.
const maxHeldBytes = 32 << 20

// heldData is a home's table of small files' bytes, one version per path,
// so that consumers that ask after a publish need no transfer either. The
// bytes arrive with the provisional record (generation 0); the committed
// record that follows names the same publish (the owner numbers its
// publishes) and gives them its generation. Notices may arrive out of
// order: bytes are only ever given the generation of their own publish.
// The oldest entries go first when the bytes exceed maxHeldBytes. Callers
// lock.
type heldData struct {
	byPath map[string]heldEntry
	order  []heldRef // insertion order; refs to replaced entries are skipped
	bytes  int
	slots  uint64
}

type heldEntry struct {
	owner      string
	publish    uint64 // the owner's number for the publish
	size       int64
	mtimeNs    int64
	generation uint64
	in         *hfl.Inline
	slot       uint64
}

type heldRef struct {
	path string
	slot uint64
}

func newHeldData() *heldData { return &heldData{byPath: make(map[string]heldEntry)} }

// put keeps the bytes rec carries, sent with publish number publish of
// its owner, replacing what was held for its path.
func (h *heldData) put(rec hfl.Record, publish uint64) {
	if rec.Inline == nil {
		return
	}
	h.drop(rec.Path, "")
	h.slots++
	h.byPath[rec.Path] = heldEntry{owner: rec.Owner, publish: publish, size: rec.Size, mtimeNs: rec.MtimeNs,
		generation: rec.Generation, in: rec.Inline, slot: h.slots}
	h.order = append(h.order, heldRef{path: rec.Path, slot: h.slots})
	h.bytes += len(rec.Inline.Data)
	for h.bytes > maxHeldBytes && len(h.order) > 0 {
		ref := h.order[0]
		h.order = h.order[1:]
		if e, ok := h.byPath[ref.path]; ok && e.slot == ref.slot {
			h.drop(ref.path, "")
		}
	}
	if len(h.order) > 2*len(h.byPath)+64 {
		h.compact()
	}
}

// drop forgets path's bytes (if owner is not "", only if owner's).
func (h *heldData) drop(path, owner string) {
	e, ok := h.byPath[path]
	if !ok || (owner != "" && e.owner != owner) {
		return
	}
	delete(h.byPath, path)
	h.bytes -= len(e.in.Data)
}

// compact drops the order's references to replaced entries.
func (h *heldData) compact() {
	keep := make([]heldRef, 0, len(h.byPath))
	for _, ref := range h.order {
		if e, ok := h.byPath[ref.path]; ok && e.slot == ref.slot {
			keep = append(keep, ref)
		}
	}
	h.order = keep
}

// commit gives the bytes of publish number publish of rec's owner, if held,
// rec's generation.
func (h *heldData) commit(rec hfl.Record, publish uint64) {
	e, ok := h.byPath[rec.Path]
	if ok && publish != 0 && e.publish == publish && e.owner == rec.Owner && e.size == rec.Size && e.mtimeNs == rec.MtimeNs {
		e.generation = rec.Generation
		h.byPath[rec.Path] = e
	}
}

// attach returns rec with the bytes held for exactly its version.
func (h *heldData) attach(rec hfl.Record) hfl.Record {
	e, ok := h.byPath[rec.Path]
	if ok && e.owner == rec.Owner && e.size == rec.Size && e.mtimeNs == rec.MtimeNs && e.generation == rec.Generation {
		rec.Inline = e.in
	}
	return rec
}
