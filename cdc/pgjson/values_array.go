package pgjson

// Arrays: PostgreSQL's text output of an array ("{1,2,NULL}", nested
// dimensions, optional bounds) turned into JSON arrays, each element
// encoded as AppendValue encodes its type.

// AppendArray appends the JSON array for an array in PostgreSQL's text
// output format whose elements have type elem and are separated by delim
// (pg_type.typdelim: ',' for every built-in type but box, ';').
// AppendValue calls it for the built-in array types; a caller that looks
// up a user-defined array type's typelem and typdelim (an array of enums,
// say) can call it directly.
//
// Each element is encoded as AppendValue encodes elem, an unquoted NULL as
// null (a quoted "NULL" is the string), each dimension as a nested array.
// Lower bounds other than 1 ("[0:2]={1,2,3}") are dropped.
func AppendArray(dst []byte, elem uint32, delim byte, text []byte) ([]byte, error) {
	p := text
	if len(p) > 0 && p[0] == '[' {
		// Dimension decoration: ("[" lower ":" upper "]")+ "=".
		for len(p) > 0 && p[0] == '[' {
			i := 1
			for i < len(p) && p[i] != ']' {
				i++
			}
			if i == len(p) || !isBounds(p[1:i]) {
				return dst, malformed("array bounds", text)
			}
			p = p[i+1:]
		}
		if len(p) == 0 || p[0] != '=' {
			return dst, malformed("array bounds", text)
		}
		p = p[1:]
	}
	if len(p) == 0 || p[0] != '{' {
		return dst, malformed("array", text)
	}
	dst, p, err := appendArrayLevel(dst, elem, delim, p, 1)
	if err != nil {
		return dst, err
	}
	if len(p) != 0 {
		return dst, malformed("array", text)
	}
	return dst, nil
}

// isBounds reports whether s is "lower:upper" (signed integers).
func isBounds(s []byte) bool {
	for i, c := range s {
		if c == ':' {
			return isJSONInteger(s[:i]) && isJSONInteger(s[i+1:])
		}
	}
	return false
}

// maxDims is PostgreSQL's MAXDIM: no array has more dimensions, and the
// limit bounds our recursion on hostile input.
const maxDims = 6

// appendArrayLevel appends the array at the start of p, which begins with
// '{', and returns the rest of p after its '}'.
func appendArrayLevel(dst []byte, elem uint32, delim byte, p []byte, dim int) ([]byte, []byte, error) {
	if dim > maxDims {
		return dst, p, malformed("array", p)
	}
	p = p[1:]
	dst = append(dst, '[')
	if len(p) > 0 && p[0] == '}' {
		return append(dst, ']'), p[1:], nil
	}
	for {
		var err error
		switch {
		case len(p) == 0:
			return dst, p, malformed("array", p)
		case p[0] == '{':
			dst, p, err = appendArrayLevel(dst, elem, delim, p, dim+1)
		case p[0] == '"':
			// A quoted element: '\' escapes the next byte.
			escaped := false
			i := 1
			for i < len(p) && p[i] != '"' {
				if p[i] == '\\' {
					escaped = true
					i++
				}
				i++
			}
			if i >= len(p) {
				return dst, p, malformed("array element", p)
			}
			raw := p[1:i]
			p = p[i+1:]
			if !escaped {
				dst, err = AppendValue(dst, elem, raw)
				break
			}
			// Unescape into dst past its end, encode after that, then
			// move the encoding down over the scratch bytes: no
			// allocation when dst has room. The scratch stays readable
			// even if AppendValue grows dst: it reads the old array.
			n := len(dst)
			for j := 0; j < len(raw); j++ {
				if raw[j] == '\\' {
					j++
				}
				dst = append(dst, raw[j])
			}
			m := len(dst)
			dst, err = AppendValue(dst, elem, dst[n:m])
			if err == nil {
				dst = dst[:n+copy(dst[n:], dst[m:])]
			}
		default:
			// An unquoted element: array_out quotes anything holding the
			// delimiter, braces, quotes, backslashes or spaces.
			i := 0
			for i < len(p) && p[i] != delim && p[i] != '}' {
				if c := p[i]; c == '{' || c == '"' || c == '\\' {
					return dst, p, malformed("array element", p)
				}
				i++
			}
			raw := p[:i]
			if len(raw) == 0 {
				return dst, p, malformed("array element", p)
			}
			p = p[i:]
			if len(raw) == 4 && raw[0]|0x20 == 'n' && raw[1]|0x20 == 'u' && raw[2]|0x20 == 'l' && raw[3]|0x20 == 'l' {
				dst = append(dst, "null"...)
				break
			}
			dst, err = AppendValue(dst, elem, raw)
		}
		if err != nil {
			return dst, p, err
		}
		switch {
		case len(p) == 0:
			return dst, p, malformed("array", p)
		case p[0] == '}':
			return append(dst, ']'), p[1:], nil
		case p[0] != delim:
			return dst, p, malformed("array", p)
		}
		p = p[1:]
		dst = append(dst, ',')
	}
}

// arrayElem maps the OID of every built-in array type to its element's
// OID (pg_type.typarray → pg_type.oid for oid < 10000; TestArrayTypes
// checks it against the server). Built-in OIDs are fixed across versions;
// user-defined types get OIDs ≥ 16384 and are not here.
var arrayElem = map[uint32]uint32{
	143:   142,  // xml[]
	199:   114,  // json[]
	210:   71,   // pg_type[]
	270:   75,   // pg_attribute[]
	271:   5069, // xid8[]
	272:   81,   // pg_proc[]
	273:   83,   // pg_class[]
	629:   628,  // line[]
	651:   650,  // cidr[]
	719:   718,  // circle[]
	775:   774,  // macaddr8[]
	791:   790,  // money[]
	1000:  16,   // bool[]
	1001:  17,   // bytea[]
	1002:  18,   // char[]
	1003:  19,   // name[]
	1005:  21,   // int2[]
	1006:  22,   // int2vector[]
	1007:  23,   // int4[]
	1008:  24,   // regproc[]
	1009:  25,   // text[]
	1010:  27,   // tid[]
	1011:  28,   // xid[]
	1012:  29,   // cid[]
	1013:  30,   // oidvector[]
	1014:  1042, // bpchar[]
	1015:  1043, // varchar[]
	1016:  20,   // int8[]
	1017:  600,  // point[]
	1018:  601,  // lseg[]
	1019:  602,  // path[]
	1020:  603,  // box[]
	1021:  700,  // float4[]
	1022:  701,  // float8[]
	1027:  604,  // polygon[]
	1028:  26,   // oid[]
	1034:  1033, // aclitem[]
	1040:  829,  // macaddr[]
	1041:  869,  // inet[]
	1115:  1114, // timestamp[]
	1182:  1082, // date[]
	1183:  1083, // time[]
	1185:  1184, // timestamptz[]
	1187:  1186, // interval[]
	1231:  1700, // numeric[]
	1263:  2275, // cstring[]
	1270:  1266, // timetz[]
	1561:  1560, // bit[]
	1563:  1562, // varbit[]
	2201:  1790, // refcursor[]
	2207:  2202, // regprocedure[]
	2208:  2203, // regoper[]
	2209:  2204, // regoperator[]
	2210:  2205, // regclass[]
	2211:  2206, // regtype[]
	2287:  2249, // record[]
	2949:  2970, // txid_snapshot[]
	2951:  2950, // uuid[]
	3221:  3220, // pg_lsn[]
	3643:  3614, // tsvector[]
	3644:  3642, // gtsvector[]
	3645:  3615, // tsquery[]
	3735:  3734, // regconfig[]
	3770:  3769, // regdictionary[]
	3807:  3802, // jsonb[]
	3905:  3904, // int4range[]
	3907:  3906, // numrange[]
	3909:  3908, // tsrange[]
	3911:  3910, // tstzrange[]
	3913:  3912, // daterange[]
	3927:  3926, // int8range[]
	4073:  4072, // jsonpath[]
	4090:  4089, // regnamespace[]
	4097:  4096, // regrole[]
	4192:  4191, // regcollation[]
	5039:  5038, // pg_snapshot[]
	6150:  4451, // int4multirange[]
	6151:  4532, // nummultirange[]
	6152:  4533, // tsmultirange[]
	6153:  4534, // tstzmultirange[]
	6155:  4535, // datemultirange[]
	6157:  4536, // int8multirange[]
	10052: 1248, // pg_database[]
	10057: 2842, // pg_authid[]
	10058: 2843, // pg_auth_members[]
	10093: 4066, // pg_shseclabel[]
	10112: 6101, // pg_subscription[]
}
