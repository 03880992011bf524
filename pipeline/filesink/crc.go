package filesink

// crcCombine returns the CRC-32C of A||B from crcA, crcB and the length of
// B, without reading either (zlib's crc32_combine, over the Castagnoli
// polynomial): the staged and published files' checksums are extended by
// whole ranges this way, so a commit never reads back what it staged.
func crcCombine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA ^ crcB
	}
	var even, odd [32]uint32
	odd[0] = 0x82F63B78 // the reflected Castagnoli polynomial
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	gf2Square(&even, &odd) // the operator for two zero bits
	gf2Square(&odd, &even) // four
	for {
		gf2Square(&even, &odd) // one zero byte, then 4, 16, ...
		if lenB&1 != 0 {
			crcA = gf2Times(&even, crcA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
		gf2Square(&odd, &even)
		if lenB&1 != 0 {
			crcA = gf2Times(&odd, crcA)
		}
		if lenB >>= 1; lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

// crcRange returns the CRC-32C of the bytes between two prefixes of one
// stream: crcTo is the CRC of its first to bytes, crcFrom of its first
// from bytes.
func crcRange(crcFrom, crcTo uint32, from, to int64) uint32 {
	return crcTo ^ crcCombine(crcFrom, 0, to-from)
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}
